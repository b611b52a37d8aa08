"""The grammar every hangwatch command line shares: durations, listen addresses, bad usage.

People move between flags and config keys, so a time flag takes what a config key takes (``500ms``,
``5s``, ``15m``, ``1h``) and, where it took one before, a bare number of seconds; ``--listen`` takes
``HOST:PORT`` or ``:PORT``; and bad usage is one line naming the command and exit 64, whichever
command it is (the faces', the simulator's and the demo's parsers are this one).
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Callable

from .settings import EXIT_CONFIG, ConfigError, duration, human, listen_address

DAY = 86400.0


class Parser(argparse.ArgumentParser):
    """argparse, with errors as one line (``hangwatch check: argument --interval: ...``) and exit 64."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_CONFIG)


def seconds(*, low: float = 0.0, high: float = 30 * DAY, bare: bool = True,
            above: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: ``500ms``, ``5s``, ``15m``, ``1h`` as a config key, or (``bare``) a plain
    number of seconds; within ``low``..``high`` (``above``: strictly more than ``low``)."""
    def parse(text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            number = None
        try:
            if number is None or not bare:
                value = duration(text, "flag", low=low, high=high)
            elif not math.isfinite(number) or not low <= number <= high:
                raise ConfigError(f"flag: {text} is out of range ({human(low)} to {human(high)})")
            else:
                value = number
        except ConfigError as exc:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]
                                             + ("; a bare number is seconds" if bare else "")) from None
        if above and value <= low:
            raise argparse.ArgumentTypeError(f"{text} must be more than {low:g}s")
        return value
    parse.__name__ = "duration"  # argparse's "invalid duration value" if anything slips through
    return parse


def listen(text: str) -> tuple[str, int]:
    """An argparse ``type`` for ``--listen``: ``HOST:PORT`` or ``:PORT`` (loopback) → (host, port)."""
    try:
        return listen_address(text)
    except ConfigError as exc:  # argparse names the flag itself: say it once
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None
