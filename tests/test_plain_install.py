"""After the README's ``pip install .`` (a plain install, not editable), every command the README and
the docs name works, from the checkout's root and from anywhere else.

Before, from the root, ``python -m demo``, ``python -m hangwatch`` and ``python -m hangwatch.simulator``
died with ``No module named 'hangwatch.rules'``: Python puts the root first on ``sys.path``, where
``hangwatch/`` is the core's folder alone (the faces and tools are installed from other folders).
CI never saw it, because it installs editable right after. The demo also imported ``harness/``,
which is not installed: fine in a checkout, a crash anywhere else.
"""
from __future__ import annotations

import subprocess

import pytest

from harness import REPO
from tests.support.wheel import plain_install

ROOT, ELSEWHERE = "the checkout's root", "another directory"

COMMANDS = {  # what the README and docs tell a user to run, and a line its output must hold
    "python -m hangwatch --version": (["python", "-m", "hangwatch", "--version"], "hangwatch 0.3"),
    "hangwatch --version": (["hangwatch", "--version"], "hangwatch 0.3"),
    "python -m hangwatch.simulator --help": (["python", "-m", "hangwatch.simulator", "--help"], "usage: hangwatch simulate"),
    "hangwatch simulate --help": (["hangwatch", "simulate", "--help"], "--control-listen"),
    "hangwatch demo --help": (["hangwatch", "demo", "--help"], "usage: hangwatch demo"),
    "python -m hangwatch demo --help": (["python", "-m", "hangwatch", "demo", "--help"], "no Docker, no GPU"),
    "hangwatch exporter --help": (["hangwatch", "exporter", "--help"], "/probe?target="),
    "hangwatch check --help": (["hangwatch", "check", "--help"], "exit codes: 0 idle"),
}


def run(argv: list[str], cwd, **kwargs) -> subprocess.CompletedProcess:
    venv = plain_install()
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.mark.parametrize("where", [ROOT, ELSEWHERE])
@pytest.mark.parametrize("command", COMMANDS, ids=COMMANDS)
def test_every_documented_command_runs_after_a_plain_install(command, where, tmp_path):
    argv, expected = COMMANDS[command]
    done = run(argv, REPO if where == ROOT else tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout, done.stdout


@pytest.mark.parametrize("where", [ROOT, ELSEWHERE])
def test_rules_and_the_dashboard_are_written_after_a_plain_install(where, tmp_path):
    for command, written in (("rules", "hangwatch-alerts.yml"), ("dashboard", "hangwatch.json")):
        done = run(["python", "-m", "hangwatch", command, "--out", str(tmp_path / command)],
                   REPO if where == ROOT else tmp_path)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / command / written).is_file()


IMPORT_ALL = """
import importlib, pkgutil, hangwatch
names = [m.name for m in pkgutil.walk_packages(hangwatch.__path__, "hangwatch.")]
for part in ("exporter", "webhook", "simulator", "rules", "dashboards", "demo", "examples"):
    package = importlib.import_module("hangwatch." + part)
    names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    if not name.endswith("__main__"):
        importlib.import_module(name)
print(len(names), "modules;", importlib.import_module("hangwatch.demo.chain").__file__)
"""


def test_every_installed_module_imports_without_the_checkout(tmp_path):
    """From elsewhere nothing of the checkout is on sys.path: an import of ``harness`` or ``tests``
    by installed code fails here, and every module comes from the install."""
    done = run(["python", "-c", IMPORT_ALL], tmp_path)
    assert done.returncode == 0, done.stderr
    assert str(plain_install()) in done.stdout and str(REPO) not in done.stdout, done.stdout


def test_from_the_root_the_checkout_is_one_whole_package(tmp_path):
    """From the root ``hangwatch`` is the checkout's folder; each part installed from another folder is
    found in that folder (``hangwatch.checkout``), so the checkout's code runs whole, never half of it."""
    done = run(["python", "-c", IMPORT_ALL], REPO)
    assert done.returncode == 0, done.stderr
    assert str(REPO / "demo" / "chain.py") in done.stdout, done.stdout
