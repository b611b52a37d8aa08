"""The ranges a rule reads so that it holds the last N readings, and the expressions over them.

A rule must decide over readings, not seconds: a range of exactly N scrapes holds N + 1 or N - 1
readings depending on where an evaluation falls, so every window's edge sits half a scrape from
every reading (``readings_windows``), and the progress and restart signals are read from one series
per target each, the cheapest expression that sees the same work.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings

# Where a window's edge sits between two readings, as a share of the scrape interval: half-way,
# as far as can be from every reading (see the header render.py writes).
EDGE = 0.5


def format_duration(seconds: float) -> str:
    """A Prometheus duration, exact to the millisecond: ``45s``, ``10m``, ``37500ms``."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"duration {seconds}s rounds to zero")
    if millis % 60000 == 0:
        return f"{millis // 60000}m"
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"


def readings_windows(readings: int, scrape: float) -> tuple[float, ...]:
    """The ranges which between them hold the last ``readings`` readings at every instant.

    Readings come one scrape apart. A range of (N - 1/2) scrapes holds exactly N of them in the
    first half of each scrape interval (after the newest reading is stored) and N - 1 in the
    second; a range of (N + 1/2) scrapes holds N + 1, then N — and N while the newest scrape is
    still running (Prometheus stores a reading when its scrape ends, up to scrape_timeout after
    its timestamp). The short range is used where ``up`` (one sample per scrape, failed ones
    included) shows it holds at least N scrapes, else the long one where it does: on schedule
    that is exactly N. Both edges sit half a scrape from every reading, so closed (Prometheus 2)
    and left-open (Prometheus 3) ranges agree, and scrape jitter, the rule evaluation's phase and
    the scrape's duration move no reading across an edge.

    A scrape more than half an interval late leaves both ranges short of N readings until it
    comes, and with the next one on time puts two readings in one half interval, so that a range
    holds N + 1 for a while. Asking for exactly N found no range then, for an evaluation or two:
    a frozen server read busy in between and its hang alert fired twice (bench/RESULTS-exporter.md,
    "Late scrapes"). So a range is used where it holds at least N readings,
    and decisions over three readings or more (the ones a hang rests on) have a third range,
    N + 3/2 scrapes, used only where neither of the others holds N: while a scrape is up to one
    and a half intervals late. On schedule the third range is never used. Where a range holds
    more than N, a decision reads the last N readings and older ones, and each is the cautious
    one: progress in any, a restart in any, a reading missing or not in flight in any keeps a
    target from hung. Two-reading decisions (a restart) go without the third range: their
    counters are the costliest to read, and a hang over the same readings is kept from hung by
    the three-reading start-time check anyway.
    """
    windows = ((readings - 1 + EDGE) * scrape, (readings + EDGE) * scrape)
    if readings >= 3:
        windows += ((readings + 1 + EDGE) * scrape,)
    return windows


def readings_for(grace: float, scrape: float) -> int:
    """Readings needed to span ``grace`` seconds: hangwatch/verdict.py asks stalled_for >= grace."""
    return max(3, math.ceil(grace / scrape - 1e-9) + 1)


def readings_expr(expr: str, readings: int, settings: Settings) -> str:
    """``expr`` (ranges written ``${range}``) over the last ``readings`` readings (see ``readings_windows``).

    Each range's branch is kept where ``up`` shows it holds at least N scrapes. An expression
    that reads that count itself (``${scrapes_in_range}``, with ``${readings}`` for N) keeps
    only such ranges itself and is not wrapped: one range read of ``up`` less per range."""
    parts = []
    def scrapes(range_text: str) -> str:
        return f"count_over_time(up{{{job_matcher(settings)}}}[{range_text}])"

    for window in readings_windows(readings, settings.scrape_interval):
        text = format_duration(window)
        filled = (expr.strip().replace("${range}", text).replace("${scrapes_in_range}", scrapes(text))
                  .replace("${readings}", str(readings)))
        body = "\n".join("    " + line for line in filled.splitlines())
        if "${scrapes_in_range}" in expr:
            parts.append(f"(\n{body}\n)")
        else:
            parts.append(f"(\n{body}\n)\n  and on (job, instance) {scrapes(text)} >= {readings}")
    return "\n or\n".join(parts) + "\n"


PROGRESS_FINGERPRINT = "hangwatch_engine_progress_fingerprint"


def progress_expr(range_text: str = "${range}") -> str:
    """Engine work over a range: the number of times the exporter's progress fingerprint changed.

    The fingerprint (``hangwatch.exposition.progress_fingerprint``) changes whenever one of the
    engine's progress signals does, so this is one ``changes()`` over one series per target.
    Reading every signal instead (a union of each signal's ``changes()``) was the costliest part of
    the recording group at fleet scale (bench/RESULTS-exporter.md, "One series for progress").
    tests/rules/test_signal_union.py checks that both find the same work."""
    return f"changes({PROGRESS_FINGERPRINT}[{range_text}])\n"


COUNTERS_SUM = "hangwatch_engine_counters_total"


def resets_expr(range_text: str = "${range}") -> str:
    """A new process over a range, where the engine gives no start time: its counters going back.

    One ``resets()`` of the sum of the counters (``hangwatch.exposition.counters_sum``), not one
    per counter: reading every counter over both ranges was the costliest rule of the group.
    tests/rules/test_signal_union.py checks that it sees the restarts the per-counter chain sees."""
    return f"resets({COUNTERS_SUM}[{range_text}])\n"


def job_matcher(settings: Settings) -> str:
    return f'job=~"{settings.job}"'


