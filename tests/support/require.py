"""Real parts are required, never silently skipped.

In CI a missing binary or venv is a failure, so a broken install step turns the run red. On a
developer's machine without the part, the test is skipped with the reason. ``tests/conftest.py``
turns every other skip under CI into a failure too, unless the test is marked
``@pytest.mark.skip_allowed(reason)``.
"""
import os
import shutil

import pytest

_NOT_CI = {"0", "false", "no", "off"}


def in_ci() -> bool:
    """True when ``CI`` is set to anything but an explicit no. ``.ci/run`` sets ``CI=true``; an
    empty ``CI`` counts as CI too: only a deliberate ``CI=false`` (or no CI variable at all)
    lets a missing part skip."""
    value = os.environ.get("CI")
    return value is not None and value.strip().lower() not in _NOT_CI


def require(condition: bool, what: str) -> None:
    """Fail in CI, skip elsewhere, when a real part is missing."""
    if condition:
        return
    message = f"real part missing: {what}"
    if in_ci():
        pytest.fail(message + " (CI must install it: see .ci/run)")
    pytest.skip(message)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"binary {name!r} on PATH")
    return path
