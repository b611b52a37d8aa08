"""``hangwatch --version`` and ``hangwatch_build_info``: which hangwatch, on which Python.

node_exporter's way: ``--version`` prints it, and each server exports a constant 1 labelled
with the version and the runtime (``node_exporter_build_info{version, goversion, ...}``), so
a dashboard or ``count by (version)`` shows what runs where. The version is written once, in
``hangwatch/__init__.py``; the wheel's metadata reads it from there (pyproject.toml, dynamic).
"""
from __future__ import annotations

import platform
import re
import subprocess
import sys
import zipfile

import pytest
from prometheus_client.parser import text_string_to_metric_families

import hangwatch
from hangwatch.cli import main
from tests.support.servers import REPO
from tests.support.wheel import built_wheel


def build_info(text: str) -> list[dict]:
    for family in text_string_to_metric_families(text):
        if family.name == "hangwatch_build_info":
            return [dict(s.labels, value=s.value) for s in family.samples]
    return []


EXPECTED = {"version": hangwatch.__version__, "python_version": platform.python_version(), "value": 1.0}


def test_version_prints_the_package_version_and_python(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"hangwatch {hangwatch.__version__} (Python {platform.python_version()})"
    assert re.fullmatch(r"\d+\.\d+\.\d+", hangwatch.__version__)


def test_the_command_prints_it_too():
    done = subprocess.run([sys.executable, "-m", "hangwatch", "--version"], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith(f"hangwatch {hangwatch.__version__} ")


def test_the_exporter_exports_build_info():
    from hangwatch.exporter.selfmetrics import own_metrics
    body = own_metrics(None).body.decode()
    assert build_info(body) == [EXPECTED]


def test_the_webhook_exports_build_info(tmp_path):
    from tests.webhook.conftest import Harness
    harness = Harness(tmp_path)
    try:
        body = harness.client.get("/metrics").get_data(as_text=True)
    finally:
        harness.close()
    assert build_info(body) == [EXPECTED]


def test_the_wheel_carries_the_same_version_and_the_license():
    with zipfile.ZipFile(built_wheel()) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta).decode()
        licenses = [n for n in archive.namelist() if "/licenses/" in n]
        assert [archive.read(n) for n in licenses] == [(REPO / "LICENSE").read_bytes()]
    assert f"\nVersion: {hangwatch.__version__}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nRequires-Python: >=3.10\n" in metadata


# -- one version everywhere ------------------------------------------------------------------------
# Where a user reads or deploys the image's tag (or the repository ref the Kubernetes docs fetch
# Components at): each must be the package version. Before, the Kubernetes docs and Components
# built and pinned hangwatch:0.2.0 while `hangwatch --version` said 0.3.0.
VERSIONED = {
    r"hangwatch:(\d+\.\d+\.\d+)": ["README.md", "docs/*.md", "deploy/**/*", "examples/**/*", "Dockerfile",
                                   "docker-compose*.yml"],
    r"\?ref=v(\d+\.\d+\.\d+)": ["README.md", "docs/*.md", "deploy/**/*"],
    r"newTag: \"(\d+\.\d+\.\d+)\"": ["deploy/kubernetes/base/kustomization.yaml",
                                     "deploy/kubernetes/components/hangwatch-sidecar/kustomization.yaml"],
    r"HANGWATCH_VERSION:-([^}]+)\}": ["docker-compose*.yml"],
    r"\| `HANGWATCH_VERSION` \| `([^`]+)`": ["docs/configuration.md"],
}


def versions_written() -> dict[str, set[str]]:
    """Every version the files above write, and where."""
    found: dict[str, set[str]] = {}
    for pattern, globs in VERSIONED.items():
        for path in sorted({p for g in globs for p in REPO.glob(g) if p.is_file() and "node_modules" not in p.parts}):
            for match in re.finditer(pattern, path.read_text(errors="replace")):
                found.setdefault(match.group(1), set()).add(f"{path.relative_to(REPO)}: {match.group(0)}")
    return found


def test_image_tags_and_refs_everywhere_are_the_package_version():
    found = versions_written()
    assert hangwatch.__version__ in found, "no tag found at all: the patterns no longer match the files"
    stale = {version: sorted(where) for version, where in found.items() if version != hangwatch.__version__}
    assert not stale, f"hangwatch is {hangwatch.__version__}; these say otherwise: {stale}"
    tagged = {line.split(":")[0] for line in found[hangwatch.__version__]}
    assert {"docs/kubernetes.md", "docker-compose.yml", "deploy/kubernetes/base/kustomization.yaml",
            "deploy/kubernetes/components/hangwatch-sidecar/kustomization.yaml"} <= tagged, tagged
