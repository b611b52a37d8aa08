"""Logging for hangwatch's servers (the exporter, the webhook), set up one way for both.

As node_exporter takes ``--log.level``/``--log.format``, both take ``--log-level`` (unset:
``$HANGWATCH_LOG_LEVEL``, else ``info``) and ``--log-format`` (``text``, or ``json``: one
object per line with ``ts``, ``level``, ``logger``, ``msg`` and ``exc``). The level applies to
``hangwatch.*`` only, so ``debug`` shows the exporter's line per probe, not every socket a
library opens. Secrets are never passed to a logger; nothing here filters them. A text line
is escaped (``printable``): a backend's words in a message cannot drive the reader's terminal
or forge a second line; JSON escapes its own.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import TextIO

from .printable import printable
from .settings import ConfigError

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LEVEL_ENV = "HANGWATCH_LOG_LEVEL"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` on a server's subcommand."""
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help=f"debug, info, warning or error (default: ${LEVEL_ENV}, else info)")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="text (default) or json: one object per line")


def resolve_level(flag: str | None, environ=os.environ) -> str:
    """The flag, else ``$HANGWATCH_LOG_LEVEL``, else ``info``; a bad variable is a ConfigError."""
    if flag:
        return flag
    value = environ.get(LEVEL_ENV, "").strip().lower()
    if not value:
        return "info"
    if value not in LEVELS:
        raise ConfigError(f"{LEVEL_ENV}: {value[:20]!r} is not one of {', '.join(LEVELS)}")
    return value


class JSONFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {"ts": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname.lower(),
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with control characters escaped: one record is one line, nothing a terminal obeys."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        head, newline, rest = text.partition("\n")  # a traceback keeps its lines
        return printable(head) + newline + printable(rest, newlines=True)


def setup(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Send log records to ``stream`` (stderr) at ``level`` in ``fmt``; calling it again replaces
    the handler it installed before (and leaves any other handler, pytest's for one, alone)."""
    if level not in LEVELS or fmt not in FORMATS:
        raise ConfigError(f"logging: level {level!r} / format {fmt!r} not in {LEVELS} / {FORMATS}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    handler._hangwatch = True  # type: ignore[attr-defined]  # ours, replaced by the next setup()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_hangwatch", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = getattr(logging, level.upper())
    root.setLevel(max(numeric, logging.INFO))           # libraries: info and above
    logging.getLogger("hangwatch").setLevel(numeric)    # hangwatch's own loggers: as asked
    return handler
