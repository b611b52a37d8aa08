"""The one loop behind every generator in deploy/: write the generated files, or say which are stale.

Files generated from one source (the compose configs from examples/, the Kubernetes copies of the
rules and the dashboard) are committed so people can read them, and a test runs ``--check`` so a
hand edit or a forgotten regeneration fails; both generators share this loop so they cannot drift.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable


def main(argv: list[str] | None, *, description: str, outputs: Callable[[], dict[str, str]], out: Path,
         rerun: str) -> int:
    """``outputs()``: path under ``out`` -> text. Writes them (0), or with ``--check`` exits 1 naming
    the stale ones and how to regenerate them (``rerun``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    parser.add_argument("--out", type=Path, default=out, help=f"where to write (default: {out})")
    args = parser.parse_args(argv)
    stale = []
    for name, text in outputs().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        sys.stderr.write(f"stale (run {rerun}): " + ", ".join(stale) + "\n")
        return 1
    return 0
