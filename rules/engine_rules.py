"""The rules generated from the engine table (``hangwatch/engines.py``), not written in a template.

Each engine's minimum grace and stall window are wall-clock values that live in the engine table,
so the rules reading them are built from it (``- generate: engine_grace``, ``- generate:
stall_window`` in a template): one table, and Python and PromQL cannot disagree on an engine's values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .windows import format_duration, progress_expr, readings_expr, readings_for

if TYPE_CHECKING:
    from .settings import Settings

PROGRESS_3 = "target:hangwatch_engine_progress:changes_3scrapes"  # recorded before the grace rule


def grace_rule(settings: Settings) -> dict:
    """1 for a backend whose engine's minimum grace (hangwatch/engines.py) is not over yet.

    One branch per distinct number of readings the graces span, not per engine: the progress
    expression is the costly part of the group (five ``changes()`` over every target, twice),
    so engines spanning the same readings share one, and a grace spanning three readings reads
    the 3-reading progress recorded just before it in the same group (rules of a group run in
    order at one evaluation time, and a later rule sees what an earlier one recorded)."""
    slow = [engine for engine in settings.engines if engine.min_grace > 0]
    by_readings: dict[int, list[str]] = {}
    for engine in slow:
        readings = readings_for(engine.min_grace * settings.wall_clock_scale, settings.scrape_interval)
        by_readings.setdefault(readings, []).append(engine.name)
    branches = []
    for readings, names in sorted(by_readings.items()):
        engines = names[0] if len(names) == 1 else "|".join(names)
        matcher = f'engine="{engines}"' if len(names) == 1 else f'engine=~"{engines}"'
        if readings == 3:
            flat = PROGRESS_3
        else:
            flat = readings_expr(progress_expr(), readings, settings)
        indented = "\n".join("        " + line for line in flat.rstrip().splitlines())
        branches.append(f"    hangwatch_backend_info{{{matcher}}}\n"
                        f"  unless on (job, instance) (\n{indented}\n  ) == 0")
    if not branches:
        expr = "vector(1) unless vector(1)\n"
    else:
        expr = ("group without (engine, module, models, version) (\n"
                + "\n or\n".join(f"  (\n{b}\n  )" for b in branches) + "\n)\n")
    names = ", ".join(f"{e.name} {format_duration(e.min_grace * settings.wall_clock_scale)}" for e in slow)
    return {
        "comment": (f"Generated from hangwatch/engines.py (min_grace: {names}). One step of these engines can "
                    "take longer than two scrapes (one llama.cpp prompt batch moves nothing for seconds), so "
                    "no progress must also hold for the engine's minimum grace, as in hangwatch/verdict.py: "
                    "1 while the readings spanning it (grace / scrape interval + 1, at least 3) are not all "
                    "without progress. Wall-clock: at a shorter scrape it spans more readings. Engines whose "
                    "graces span the same readings share one branch (the progress expression is the costly "
                    "part of this group); three readings reuse the 3-reading progress recorded above."),
        "record": "target:hangwatch_engine_progress:within_grace",
        "expr": expr,
    }


def stall_window_rule(settings: Settings) -> dict:
    """Each backend's stall window in seconds: its own (``hangwatch_stall_window_seconds``, set
    by the exporter config's ``stall_window``), else its engine's. One branch per distinct
    window, not per engine. Values, not ranges: the stall rules compare a duration held in a
    series (``target:hangwatch_engine_output:flat_seconds``) with it, so a window per target
    costs nothing more than one per engine."""
    by_window: dict[float, list[str]] = {}
    for engine in settings.engines:
        if engine.output:
            seconds = round(settings.stall_window(engine) * settings.wall_clock_scale, 3)
            by_window.setdefault(seconds, []).append(engine.name)
    branches = ["hangwatch_stall_window_seconds"]
    for seconds, names in sorted(by_window.items()):
        matcher = f'engine="{names[0]}"' if len(names) == 1 else f'engine=~"{"|".join(names)}"'
        branches.append(f"group without (engine, module, models, version) (hangwatch_backend_info{{{matcher}}})"
                        f" * {seconds:g}")
    windows = ", ".join(f"{'/'.join(names)} {format_duration(seconds)}" for seconds, names in sorted(by_window.items()))
    return {
        "comment": (f"Generated from hangwatch/engines.py (stall_window: {windows}; `hangwatch rules --stall-window` "
                    "sets them). The window is longer than any legitimate request goes without output on "
                    "the engine's hardware (a long prefill; for engines counting output only when a request "
                    "finishes, a whole request). A target's own stall_window (exporter config) wins. "
                    "Wall-clock: it does not scale with the scrape interval."),
        "record": "target:hangwatch_stall_window:seconds",
        "expr": "\nor\n".join(branches) + "\n",
    }
