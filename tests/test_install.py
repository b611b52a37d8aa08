"""Installing hangwatch as the README says, on the Pythons it claims.

- The README's install line is the one CI runs (with Debian's own python3): into a venv, since
  Debian 12 and Ubuntu 24.04 refuse ``pip install`` into their Python (PEP 668).
- ``requires-python`` says 3.10 (Ubuntu 22.04's python3). CI's machine has Debian's 3.11 only,
  so this keeps the 3.11-only syntax and standard-library names out of the code: the ones a 3.11
  developer reaches for without noticing (``tomllib``, ``asyncio.timeout``, ``datetime.UTC``,
  ``typing.Self``, ``except*``, ...). The suite itself was run on 3.10 when this was added.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CI_RUN = (REPO / ".ci" / "run").read_text()


def fresh_machine_commands() -> list[str]:
    section = README.split("## On a fresh machine", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the install-and-run block and the test block"
    return [line for line in blocks[0].splitlines() if line.strip()]


def test_ci_runs_the_readmes_install_line_with_debians_python():
    install, run = fresh_machine_commands()
    assert install == "python3 -m venv .venv && .venv/bin/pip install ."
    assert run.startswith(".venv/bin/hangwatch exporter")
    assert f"PATH=\"/usr/bin:$PATH\" bash -euo pipefail -c '{install}'" in CI_RUN
    assert 'export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"' in CI_RUN
    assert CI_RUN.index(install) < CI_RUN.index("-m pytest"), "the tests run in that venv"
    assert "python3-venv" in CI_RUN, "Debian's python3 makes venvs only with python3-venv"


def test_ci_runs_the_first_commands_on_the_plain_install_before_the_editable_one():
    """An editable install hid that ``python -m demo`` and ``python -m hangwatch`` died from the
    checkout's root after the README's plain ``pip install .``: CI runs them in between, from the root."""
    install, _ = fresh_machine_commands()
    assert ".venv/bin/hangwatch demo" in README, "the README's no-Docker, no-GPU demo"
    editable = CI_RUN.index("-e '.[test,forensics]'")
    for command in (".venv/bin/hangwatch demo", ".venv/bin/python -m hangwatch --version",
                    ".venv/bin/python -m hangwatch.simulator --help"):
        assert CI_RUN.index(install) < CI_RUN.index(command) < editable, command
    assert 'cd "$(dirname "$0")/.."' in CI_RUN.split(install)[0], "from the checkout's root"


def test_the_readme_never_installs_into_the_system_python():
    assert not re.search(r"^(sudo )?(python3? -m )?pip3? install", README, re.M)
    assert "bash .ci/run" in README


# -- Python 3.10 ---------------------------------------------------------------------------------
NEWER_MODULES = {"tomllib"}
NEWER_NAMES = {  # module -> names that module gained in 3.11 or later
    "asyncio": {"timeout", "timeout_at", "Timeout", "TaskGroup", "Runner", "Barrier"},
    "datetime": {"UTC"},
    "typing": {"Self", "Never", "LiteralString", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override"},
    "enum": {"StrEnum", "verify", "member", "nonmember", "global_enum", "ReprEnum", "EnumCheck"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "itertools": {"batched"},
}
NEWER_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}


def newer_than_310(source: str, name: str = "<code>") -> list[str]:
    """What in ``source`` needs Python 3.11 or later (syntax, and the names above)."""
    try:
        tree = ast.parse(source, name, feature_version=(3, 10))
    except SyntaxError as exc:
        return [f"{name}:{exc.lineno}: {exc.msg}"]
    guarded = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.Try)  # try: import x / except ImportError
               and any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                       for h in node.handlers)
               for statement in node.body for inner in ast.walk(statement)}
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Attribute) and node.attr == "add_note":
            found.append(f"{where}: .add_note()")
        elif isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in NEWER_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in NEWER_MODULES:
                found.append(f"{where}: from {node.module}")
            found += [f"{where}: from {node.module} import {a.name}" for a in node.names
                      if a.name in NEWER_NAMES.get(node.module, ())]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in NEWER_NAMES.get(node.value.id, ()):
                found.append(f"{where}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            found.append(f"{where}: {node.id}")
    return found


SOURCES = sorted(p for folder in ("hangwatch", "exporter", "webhook", "simulator", "rules", "demo", "tests", "deploy")
                 for p in (REPO / folder).rglob("*.py") if "node_modules" not in p.parts)


def test_nothing_needs_python_311():
    found = [hit for path in SOURCES for hit in newer_than_310(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, "requires-python says 3.10:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "import tomllib", "from tomllib import load", "async def f():\n    async with asyncio.timeout(1): pass",
    "from datetime import UTC", "x = datetime.UTC", "from typing import Self",
    "try:\n    pass\nexcept* ValueError:\n    pass", "raise ExceptionGroup('x', [ValueError()])",
    "enum.StrEnum", "e.add_note('x')",
])
def test_the_check_catches_what_310_lacks(snippet):
    assert newer_than_310(snippet)


def test_the_check_lets_310_code_through():
    assert newer_than_310("from datetime import timezone\nimport asyncio\nasyncio.wait_for(x, 1)\n"
                          "from typing import Optional\nmatch x:\n    case 1: pass\n"
                          "try:\n    import tomllib\nexcept ImportError:\n    import tomli as tomllib\n") == []
