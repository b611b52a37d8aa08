"""No import circles among installed modules (issue 34, item 5), and none new.

A circle means a child holds a reference back to its parent: neither can be read, tested or
replaced alone, and the order modules happen to be imported in decides whether a name exists yet.
Every import counts, at module level, inside functions and under ``TYPE_CHECKING`` (a type-only
import is still a reference back). The graph is built from the source with ``ast``, module by
module as pyproject's package-dir maps them, so nothing is imported to find it.

None is allowed: the last three (from before issue 34's transport, whose modules are gone) (``connect``↔``fetch``, ``httpconn``↔``httpserver``,
``loopfetch``↔``loopget``) were cut where the child held a reference to its parent (``Deadline``
in its own core leaf, an admission leaf naming what a connection asks of its server, a loop GET
passed what it needs instead of its client).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def installed_modules() -> dict[str, Path]:
    """Module name -> file, for every module pyproject's package-dir installs (read with a regex:
    tomllib is Python 3.11's, and hangwatch runs on 3.10)."""
    table = (REPO / "pyproject.toml").read_text().split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    dirs = dict(re.findall(r'^"([\w.]+)"\s*=\s*"([^"]+)"', table, re.M))
    assert "hangwatch" in dirs and "hangwatch.exporter" in dirs, dirs
    found = {}
    for package, folder in dirs.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = [f"{source}.{alias.name}" for alias in node.names]
            if all(sub in modules for sub in submodules):
                found.update(submodules)   # `from . import x`: x, not the package's __init__
            else:
                found.add(source)
                found.update(sub for sub in submodules if sub in modules)
    return {other for other in found if other in modules and other != name}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_circle_among_installed_modules():
    modules = installed_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = [sorted(circle) for circle in circles(graph)]
    assert not found, f"import circles among installed modules: {found}"


def test_the_finder_sees_a_circle():
    """The check can fail: a type-only import back to the parent is a circle."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [frozenset({"a", "b"})]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .render import Settings\n"
    path = REPO / "build" / "_circle_probe.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    try:
        modules = {"hangwatch.rules.windows": path, "hangwatch.rules.render": path}
        assert imports_of("hangwatch.rules.windows", path, modules) == {"hangwatch.rules.render"}
    finally:
        path.unlink()
