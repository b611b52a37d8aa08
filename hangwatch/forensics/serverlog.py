"""The server's recent log lines, from where they are kept, for ``logsignatures.match``.

Only what the running process wrote counts: Docker keeps a container's log across restarts, so a
line the process before the last restart wrote would name a cause that a restart already met.
Sources: Docker's log tail (timestamps on, the lines since the container started), or the systemd
journal of a unit (``journalctl -u UNIT -n N -o short-iso`` since the unit's process started).
A Kubernetes pod's log is out of reach of the webhook (it has Docker's socket, not the API
server's): there the kubelet restarts and the catalogue does not apply (docs/signatures.md).
"""
from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Callable, Sequence

JOURNAL_DEADLINE = 10.0   # seconds for one journalctl call


def split_timestamp(line: str) -> tuple[datetime | None, str]:
    """``2026-12-05T07:07:08.123456789Z text`` (Docker's ``timestamps=True``) → (when, text)."""
    stamp, _, text = line.partition(" ")
    try:
        return _parse(stamp), text
    except ValueError:
        return None, line


def _parse(stamp: str) -> datetime:
    if stamp.endswith("Z"):
        stamp = stamp[:-1] + "+00:00"
    head, dot, rest = stamp.partition(".")
    if dot:  # nanoseconds: Python takes at most six digits
        digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits):]
        stamp = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    when = datetime.fromisoformat(stamp)
    if when.tzinfo is None:
        raise ValueError("no time zone")
    return when


def since_start(lines: Sequence[str], started: datetime | None) -> list[str]:
    """The lines (Docker's, timestamped) written at or after ``started``; all of them when unknown."""
    if started is None:
        return [split_timestamp(line)[1] for line in lines]
    out = []
    for line in lines:
        when, text = split_timestamp(line)
        if when is None or when >= started:
            out.append(text)
    return out


def last_line_at(lines: Sequence[str]) -> datetime | None:
    """When the newest timestamped line was written (None: no line, or none timestamped)."""
    for line in reversed(lines):
        when, _ = split_timestamp(line)
        if when is not None:
            return when
    return None


def journal_tail(unit: str, lines: int, run: Callable = subprocess.run) -> list[str]:
    """The unit's last ``lines`` journal lines since its main process started, timestamped like
    Docker's; raises ``OSError``/``RuntimeError`` when the journal cannot be read in time."""
    answer = run(["journalctl", "--unit", unit, "--lines", str(lines), "--output", "short-iso-precise",
                  "--no-pager", "--quiet", "--boot"], capture_output=True, text=True, timeout=JOURNAL_DEADLINE)
    if answer.returncode != 0:
        raise RuntimeError(f"journalctl -u {unit}: exit {answer.returncode}: {answer.stderr.strip()[:200]}")
    out = []
    for line in answer.stdout.splitlines():
        stamp, _, rest = line.partition(" ")
        _, _, text = rest.partition(": ")  # "host unit[pid]: text"
        out.append(f"{stamp} {text}")
    return out[-lines:]
