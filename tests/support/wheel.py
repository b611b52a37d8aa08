"""One wheel of this checkout per test process, built as ``pip wheel .`` builds it for users.

Three tests read the wheel (layout, version, packaged templates). Building it three times cost
≈ 4 s each; and pip builds in the source tree (``build/``, ``*.egg-info``), so two test
processes (pytest-xdist workers) building at once could read each other's half-written files.
Builds are therefore serialized across processes by a lock file, and each process builds once.
"""
from __future__ import annotations

import fcntl
import functools
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.processes import REPO

LOCK = Path(tempfile.gettempdir()) / "hangwatch-tests-wheel.lock"


@functools.lru_cache(maxsize=None)
def built_wheel() -> Path:
    """The path of a freshly built ``hangwatch-*.whl`` (in a directory of its own)."""
    out = Path(tempfile.mkdtemp(prefix="hangwatch-wheel-"))
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("hangwatch-*.whl")
    return wheel
