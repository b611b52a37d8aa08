"""One wheel of this checkout per test process, built as ``pip wheel .`` builds it for users, and a
plain (not editable) install of it, as the README's ``pip install .`` makes one.

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
import sysconfig
import tempfile
from pathlib import Path

from harness import REPO

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


@functools.lru_cache(maxsize=None)
def plain_install() -> Path:
    """A venv holding this checkout's wheel as ``pip install .`` installs it (not editable): its
    ``bin/`` has ``python`` and the ``hangwatch`` script. Its dependencies are the test venv's (a
    ``.pth`` line: no download, seconds not minutes); hangwatch itself is only the wheel's copy."""
    venv = Path(tempfile.mkdtemp(prefix="hangwatch-plain-")) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(site, "test-venv-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-deps", "--no-index", "-q", str(built_wheel())], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return venv
