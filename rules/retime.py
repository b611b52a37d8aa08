#!/usr/bin/env python3
"""Rewrite the hangwatch rule files for another scrape interval: one documented substitution.

The shipped rules assume a 15 s scrape interval. Every duration they write in seconds
(``[45s]`` = three scrapes, ``[30s]`` = two, ``interval: 3s`` and the hang alert's
``for: 3s``) is a multiple of the scrape interval and is scaled by ``new / 15s``; durations
written in minutes are wall-clock (weights load for minutes whatever the scrape interval)
and are kept, unless ``--all`` is given (the end-to-end tests shrink everything).
Only range selectors, ``for:`` and ``interval:`` are rewritten; comments are left alone.

    python rules/retime.py --scrape-interval 3s --out /etc/prometheus/rules rules/*.yml

The tests derive their windows with this same function, never from a second rule set.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BASE_SCRAPE_SECONDS = 15.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = r"(?P<n>\d+)(?P<unit>ms|s|m|h)"
_RANGE = re.compile(r"\[" + _DURATION + r"\]")
_KEYED = re.compile(r"^(?P<key>\s*(?:for|interval):\s*)" + _DURATION + r"\s*$")


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``15s``, ``500ms`` or ``10m``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration like 15s, 500ms or 10m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"duration {seconds}s rounds to zero")
    if millis % 60000 == 0:
        return f"{millis // 60000}m"
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"


def scale(n: str, unit: str, factor: float, all_durations: bool) -> str:
    if unit in ("m", "h") and not all_durations:
        return f"{n}{unit}"
    return format_duration(int(n) * _UNITS[unit] * factor)


def retime_text(text: str, scrape_interval: float, all_durations: bool = False) -> str:
    """The rule file ``text`` with its scrape-relative durations scaled to ``scrape_interval`` s."""
    factor = scrape_interval / BASE_SCRAPE_SECONDS
    lines = []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("#"):
            lines.append(line)
            continue
        keyed = _KEYED.match(line.rstrip("\n"))
        if keyed:
            end = "\n" if line.endswith("\n") else ""
            line = keyed.group("key") + scale(keyed.group("n"), keyed.group("unit"), factor, all_durations) + end
        else:
            line = _RANGE.sub(lambda m: "[" + scale(m.group("n"), m.group("unit"), factor, all_durations) + "]", line)
        lines.append(line)
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrape-interval", required=True, type=parse_duration,
                        help="the scrape_interval of the hangwatch job, e.g. 3s")
    parser.add_argument("--all", action="store_true", help="scale wall-clock (minute) durations too (tests)")
    parser.add_argument("--out", required=True, type=Path, help="directory for the rewritten files")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.files:
        target = args.out / path.name
        target.write_text(retime_text(path.read_text(), args.scrape_interval, args.all))
        print(f"{path} -> {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
