#!/usr/bin/env python3
"""Rewrite the hangwatch rule files for another scrape interval: one documented substitution.

The shipped rules assume a 15 s scrape interval. Every duration they write in seconds
(``[45s]`` = three scrapes, ``[30s]`` = two, ``interval: 3s`` and the hang alert's
``for: 3s``) is a multiple of the scrape interval and is scaled by ``new / 15s``; durations
written in minutes are wall-clock (weights load for minutes whatever the scrape interval)
and are kept, unless ``--all`` is given (the end-to-end tests shrink everything).
Only range selectors, ``for:`` and ``interval:`` are rewritten; comments are left alone.

One exception: a line marked ``# hangwatch:grace=30s`` holds an engine's minimum grace (one
engine step can take that long, see hangwatch/engines.py), which is wall-clock: its windows
become that grace plus one scrape interval (the grace scales too only with ``--all``). That
rule is generated from the engine table (``--regen-grace FILE`` rewrites it in place).

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
_GRACE = re.compile(r"#\s*hangwatch:grace=" + _DURATION)
GRACE_BEGIN = "      # --- BEGIN generated from hangwatch/engines.py (min_grace): rules/retime.py --regen-grace\n"
GRACE_END = "      # --- END generated\n"
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
        grace = _GRACE.search(line)
        if grace:
            seconds = int(grace.group("n")) * _UNITS[grace.group("unit")]
            window = format_duration(seconds * (factor if all_durations else 1.0) + scrape_interval)
            line = _RANGE.sub(lambda m: "[" + window + "]", line)
        elif keyed:
            end = "\n" if line.endswith("\n") else ""
            line = keyed.group("key") + scale(keyed.group("n"), keyed.group("unit"), factor, all_durations) + end
        else:
            line = _RANGE.sub(lambda m: "[" + scale(m.group("n"), m.group("unit"), factor, all_durations) + "]", line)
        lines.append(line)
    return "".join(lines)


_SIGNALS = (("hangwatch_engine_steps_total", "steps"), ("hangwatch_engine_tokens_total", "tokens"),
            ("hangwatch_prefix_cache_queries_total", "prefix"), ("hangwatch_requests_finished_total", "finished"),
            ("hangwatch_kv_cache_usage_ratio", "kv"))


def grace_rule_text(engines=None) -> str:
    """The recording rule for engines whose one step can outlast two scrapes, from the table."""
    if engines is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from hangwatch.engines import ENGINES as engines
    slow = [engine for engine in engines if engine.min_grace > 0]
    lines = [GRACE_BEGIN,
             "      # Engines whose one step can take longer than two scrapes (llama.cpp: one prompt\n",
             "      # batch moves nothing for seconds): no progress must also hold for the engine's\n",
             "      # minimum grace, as in hangwatch/verdict.py. The window is the grace plus one scrape.\n",
             "      - record: target:hangwatch_engine_progress:changes_grace\n",
             "        expr: |\n"]
    for i, engine in enumerate(slow):
        grace = format_duration(engine.min_grace)
        window = format_duration(engine.min_grace + BASE_SCRAPE_SECONDS)
        signals = " or ".join(f'label_replace(changes({name}[{window}]), "signal", "{label}", "", "")'
                              for name, label in _SIGNALS)
        lines.append(("          " if i == 0 else "          or\n          ")
                     + f"(sum without (kind, signal) ({signals}) # hangwatch:grace={grace}\n")
        lines.append(f'            and on (job, instance) hangwatch_backend_info{{engine="{engine.name}"}})\n')
    lines.append(GRACE_END)
    return "".join(lines)


def regen_grace(path: Path) -> bool:
    """Rewrite the generated block in ``path``; True if it changed."""
    text = path.read_text()
    start, end = text.index(GRACE_BEGIN), text.index(GRACE_END) + len(GRACE_END)
    new = text[:start] + grace_rule_text() + text[end:]
    path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--regen-grace"]:
        for name in argv[1:]:
            print(f"{name}: {'rewritten' if regen_grace(Path(name)) else 'up to date'}", file=sys.stderr)
        return 0
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
