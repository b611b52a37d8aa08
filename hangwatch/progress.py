"""What a long wait prints on a terminal: one line per reading, a line when a capture starts and ends.

A check takes 5-15 s on a busy or hung server and a capture up to 10 s more; that long a silence
reads as hangwatch hanging itself. On a terminal each step is one line on stderr; piped, redirected
or with ``--json`` nothing extra is printed (``-v`` prints the readings anyway): scripts read the one
answer on stdout.
"""
from __future__ import annotations

import sys
from typing import TextIO

from .settings import human


class Progress:
    """Lines about a wait in progress, written to ``out`` (stderr) only when ``shown``."""

    def __init__(self, interval: float, *, shown: bool, out: TextIO | None = None):
        self.interval, self.shown, self.out = interval, shown, out
        self.readings = 0

    @staticmethod
    def on_terminal(*, json_out: bool = False) -> bool:
        """Show progress: a person watches (stderr is a terminal) and no JSON was asked for."""
        return not json_out and sys.stderr.isatty()

    def say(self, line: str) -> None:
        if self.shown:
            out = self.out or sys.stderr
            out.write(line + "\n")
            out.flush()

    def reading(self, observation, verdict) -> None:
        """``check``'s ``on_observation``: what this reading saw, the verdict so far, what comes next."""
        self.readings += 1
        reading = observation.reading
        seen = f"in_flight={reading.in_flight:g}" if reading else f"status={observation.status}"
        probe = observation.probe.outcome if observation.probe else "no"
        then = f"; reading again in {human(self.interval)}" if not verdict.settled else ""
        self.say(f"reading {self.readings}: {seen} probe={probe} -> {verdict.state}: {verdict.reason}{then}")
