"""The benchmarks stand on the shared harness, never on the tests; the demo on installed code alone.

``harness/`` (top level, not installed) is what tests and ``bench/`` share; a benchmark that
imports ``tests`` ties a script to the test suite's layout. The demo is installed
(``hangwatch demo``, from ``demo/``): it imports neither (tests/test_layout.py checks every installed
module), and what tests share with it (waits, processes, the Prometheus chain) is installed with it.
The simulator, installed as ``hangwatch.simulator``, keeps to the house's 400-line module limit
(tests/test_layout.py, with every installed module).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "demo").rglob("*.py"), *(ROOT / "bench").rglob("*.py"), *(ROOT / "harness").rglob("*.py")])


def top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_demo_bench_and_harness_import_nothing_from_tests(path):
    assert "tests" not in top_level_imports(path)


def test_the_benchmarks_use_the_shared_harness_and_the_demo_does_not():
    users = [p for p in SCRIPTS if "harness" in top_level_imports(p) and p.parts[-2] in ("demo", "bench")]
    assert {p.parts[-2] for p in users} == {"bench"}
