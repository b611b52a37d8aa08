"""A checkout runs as the installed package: ``hangwatch.exporter`` is ``exporter/`` there too.

pyproject installs the faces and tools under ``hangwatch`` from the top-level folders users know
(``PARTS``: ``exporter/`` becomes ``hangwatch.exporter``). Run from a checkout's root
(``python -m hangwatch``, ``python -m hangwatch.simulator``), Python puts the root first on
``sys.path``, so ``hangwatch`` is the core's folder, which holds none of them: an installed copy
elsewhere is shadowed, and ``hangwatch.rules`` was "not found". Here each part is found in its
folder, as the wheel is built from it, so the checkout and the install are the same package. An
installed hangwatch has no checkout around it and is left alone.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

# hangwatch.<part> -> its folder in a checkout: pyproject's [tool.setuptools.package-dir] (tests/test_layout.py).
PARTS = {
    "exporter": "exporter",
    "webhook": "webhook",
    "simulator": "simulator",
    "rules": "rules",
    "dashboards": "grafana/dashboards",
    "demo": "demo",
    "examples": "examples",
}


class CheckoutParts(importlib.abc.MetaPathFinder):
    """Finds ``hangwatch.<part>`` in the checkout's folder for it (only those, only there)."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        package, _, part = fullname.partition(".")
        folder = PARTS.get(part) if package == "hangwatch" else None
        if folder is None or not (self.root / folder / "__init__.py").is_file():
            return None
        location = self.root / folder
        return importlib.util.spec_from_file_location(fullname, location / "__init__.py",
                                                      submodule_search_locations=[str(location)])


def root_of(package_file: str) -> Path | None:
    """The checkout the core at ``package_file`` lives in, or None (an installed hangwatch)."""
    root = Path(package_file).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "exporter" / "__init__.py").is_file() else None


def find_parts_in(package_file: str) -> None:
    """Let ``hangwatch.<part>`` resolve to the checkout's folders, when this core is a checkout's."""
    root = root_of(package_file)
    if root is not None and not any(isinstance(f, CheckoutParts) for f in sys.meta_path):
        sys.meta_path.append(CheckoutParts(root))
