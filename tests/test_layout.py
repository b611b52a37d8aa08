"""The shape of the house (docs/design.md, "Where things are"), checked rather than hoped for.

- The verdict core (``hangwatch/``) imports no face, no web framework, no Docker SDK and no
  prometheus_client; only ``hangwatch/cli.py`` knows every face.
- A face (``exporter/`` = ``hangwatch.exporter``, ``webhook/`` = ``hangwatch.webhook``)
  imports the core, never the other face; the simulator (a tool) imports no face.
- Everything installed lives under ``hangwatch``: a built wheel holds nothing else, and installed
  code imports nothing that is not installed (``harness``, ``tests``, ``bench``).
"""
from __future__ import annotations

import ast
import re
import zipfile
from pathlib import Path

import pytest

from hangwatch.checkout import PARTS
from tests.support.wheel import built_wheel

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("flask", "werkzeug", "waitress", "docker", "prometheus_client")
FACES = {"exporter": "hangwatch.exporter", "webhook": "hangwatch.webhook"}


def imported(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, absolute (relative imports resolved against ``package``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def offending(names: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {name for name in names if any(name == f or name.startswith(f + ".") for f in forbidden)}


CORE = sorted(p for p in (ROOT / "hangwatch").rglob("*.py") if p.name not in ("cli.py", "__main__.py"))


@pytest.mark.parametrize("path", CORE, ids=[str(p.relative_to(ROOT / "hangwatch")) for p in CORE])
def test_the_core_imports_no_face_and_no_framework(path):
    bad = offending(imported(path, "hangwatch"), (*FACES.values(), "hangwatch.simulator", *FRAMEWORKS))
    assert not bad, f"hangwatch/{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("folder", sorted(FACES))
def test_a_face_never_imports_the_other_face(folder):
    other = [name for key, name in FACES.items() if key != folder]
    for path in sorted((ROOT / folder).glob("*.py")):
        bad = offending(imported(path, FACES[folder]), (*other, folder, "hangwatch.simulator",
                                                        *(k for k in FACES if k != folder)))
        assert not bad, f"{folder}/{path.name} imports {sorted(bad)}"


def test_the_exporter_needs_no_web_framework_and_no_docker():
    for path in sorted((ROOT / "exporter").glob("*.py")):
        bad = offending(imported(path, "hangwatch.exporter"), ("flask", "werkzeug", "waitress", "docker"))
        assert not bad, f"exporter/{path.name} imports {sorted(bad)}"


def test_the_simulator_imports_no_face():
    for path in sorted((ROOT / "simulator").glob("*.py")):
        bad = offending(imported(path, "hangwatch.simulator"), tuple(FACES.values()))
        assert not bad, f"simulator/{path.name} imports {sorted(bad)}"


def test_the_checker_itself_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ..webhook import app\nimport flask\nfrom .fetch import Client\n")
    found = imported(bad, "hangwatch.exporter")
    assert offending(found, ("hangwatch.webhook", "flask")) == {"hangwatch.webhook", "hangwatch.webhook.app", "flask"}
    assert "hangwatch.exporter.fetch" in found


def test_tests_import_the_installed_names_only():
    old = ("exporter", "webhook", "simulator", "demo", "rules", "examples")
    for path in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "demo").glob("*.py")) \
            + sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "harness").glob("*.py")):
        bad = {name for name in imported(path, "tests") if name.split(".")[0] in old}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: use hangwatch.*"


def test_the_wheel_installs_nothing_outside_hangwatch():
    names = zipfile.ZipFile(built_wheel()).namelist()
    outside = sorted({name.split("/")[0] for name in names} - {"hangwatch"}
                     - {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
    assert not outside, f"the wheel installs {outside} beside hangwatch"
    for expected in ("hangwatch/check.py", "hangwatch/exporter/server.py", "hangwatch/webhook/app.py",
                     "hangwatch/simulator/pages/single.prom", "hangwatch/demo/run.py", "hangwatch/demo/chain.py",
                     "hangwatch/examples/prometheus.yml", "hangwatch/examples/alertmanager.yml"):
        assert expected in names, expected


INSTALLED = {"hangwatch": "hangwatch", **{folder: f"hangwatch.{part}" for part, folder in PARTS.items()}}
MODULE_LINES = 400


@pytest.mark.parametrize("folder", sorted(INSTALLED), ids=sorted(INSTALLED))
def test_installed_code_imports_only_what_is_installed(folder):
    """``hangwatch demo`` once imported ``harness`` (not installed): fine from a checkout, a crash after
    ``pip install .`` anywhere else."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = offending(imported(path, INSTALLED[folder]), ("harness", "tests", "bench", "demo", "exporter",
                                                            "webhook", "simulator", "rules", "examples"))
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, which is not installed"


def test_no_installed_module_is_a_wall():
    """A module over 400 lines holds more than one job (issue 27): split it by job."""
    walls = {str(path.relative_to(ROOT)): lines
             for folder in INSTALLED for path in sorted((ROOT / folder).rglob("*.py"))
             if (lines := len(path.read_text().splitlines())) > MODULE_LINES}
    assert not walls, f"installed modules over {MODULE_LINES} lines: {walls}"


def test_the_installed_folders_are_the_wheels_packages():
    """The wall check above reads every installed folder, and a checkout finds each part in its folder
    (``hangwatch.checkout.PARTS``): the same map as pyproject's package-dir."""
    section = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-dir]")[1].split("\n[")[0]
    package_dir = dict(re.findall(r'^"([\w.]+)"\s*=\s*"([\w/]+)"', section, re.M))
    assert {folder: name for name, folder in package_dir.items()} == INSTALLED
