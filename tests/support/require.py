"""Real parts are required, never silently skipped.

In CI (``CI`` set) a missing binary or venv is a failure, so a broken install step turns the
run red. On a developer's machine without the part, the test is skipped with the reason.
"""
import os
import shutil

import pytest


def require(condition: bool, what: str) -> None:
    """Fail in CI, skip elsewhere, when a real part is missing."""
    if condition:
        return
    message = f"real part missing: {what}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must install it: see .ci/run)")
    pytest.skip(message)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"binary {name!r} on PATH")
    return path
