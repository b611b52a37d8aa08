"""The webhook's memory: an append-only, fsync'd JSON-lines ledger (``state_dir/ledger.jsonl``).

Cooldowns, budgets and circuits must survive a restart of the webhook and agree between replicas,
so they are computed from this file, never from memory alone (docs/design.md, "Why the webhook's
memory is a ledger"): writes are whole or absent (under ``locks/ledger.lock``, a torn tail cut first,
a short write undone: ``LedgerError``, and the policy fails closed), reading keeps only what the
decisions need, and past ``rotate_bytes`` the records that still matter replace the file.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from .statedir import (
    LedgerError,
    check_state_dir,
    create_new,
    fsync_dir,
    link,
    open_private,
    rename,
    replace,
    unlink,
    write_all,
)

log = logging.getLogger("hangwatch.webhook")

LEDGER_NAME = "ledger.jsonl"
ROTATE_BYTES = 16 * 1024 * 1024  # compact past this size (the old file stays as ledger.jsonl.1)
KEEP_TOLD = 64                   # alert_only and escalation lines per target carried through compaction
MAX_LINE = 64 * 1024             # a longer "line" is garbage: skipped, never held in memory
SKEW_MARGIN = 300.0              # seconds of clock difference between replicas tolerated when pruning
_DECISION = b'"event": "decision"'  # records are written with sort_keys; a decision is audit only


@dataclass
class TargetHistory:
    restarts: list[tuple[float, bytes]] = field(default_factory=list)  # (at, line): attempts that may still count
    last_restart: float | None = None
    last_line: bytes = b""                                       # the last restart's line (kept for compaction)
    last_verdict: str | None = None                              # what the last restart was for (startup.py)
    reset_at: float = 0.0                                        # last operator circuit reset
    reset_line: bytes = b""
    recovered_at: float = 0.0                                    # last time seen healthy after a restart
    recovered_line: bytes = b""
    last_stall_restart: float | None = None                      # the last restart made for a stall
    opened_at: float = 0.0                                       # last circuit opened by the policy itself
    opened_line: bytes = b""
    told: dict[str, str] = field(default_factory=dict)           # alert_only key -> its incident (wrongtool.py)
    escalated: set[str] = field(default_factory=set)             # escalation keys already run (escalation.py)
    told_lines: list[tuple[float, bytes]] = field(default_factory=list)  # the last KEEP_TOLD (kept on compaction)


class Ledger:
    def __init__(self, state_dir: str, *, keep: float = 3600.0, rotate_bytes: int = ROTATE_BYTES):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, LEDGER_NAME)
        self.keep = keep
        self.rotate_bytes = rotate_bytes
        for directory in (state_dir, os.path.join(state_dir, "incidents"), os.path.join(state_dir, "locks")):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        check_state_dir(state_dir)
        self._lock_path = os.path.join(state_dir, "locks", "ledger.lock")
        try:
            with self._locked():  # never create it while another replica compacts it
                os.close(open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
        except OSError as exc:
            raise LedgerError(f"cannot use {exc.filename or self.path}: {exc.strerror or exc}") from None
        self._mutex = threading.Lock()
        self._file_id: tuple[int, int] | None = None
        self._offset = 0
        self._history: dict[str, TargetHistory] = {}
        self.refresh()
        if self._offset >= self.rotate_bytes:  # e.g. a ledger grown by an older version
            with self._mutex, self._locked():
                self._refresh()
                if self._offset >= self.rotate_bytes:
                    self._compact_quietly()

    def close(self) -> None:
        """Nothing stays open between calls; kept so the app can say it is done."""

    # -- writing ----------------------------------------------------------------------------
    def append(self, record: dict) -> None:
        """Write one line durably, then re-read; ``LedgerError`` if it could not be written whole."""
        line = encode(record)
        with self._mutex:
            try:
                with self._locked():
                    fd = open_private(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
                    try:
                        size = _cut_torn_tail(fd, self.path)
                        try:
                            write_all(fd, line)
                            os.fsync(fd)
                        except OSError:
                            _undo(fd, size)
                            raise
                    finally:
                        os.close(fd)
                    self._refresh()
                    if self._offset >= self.rotate_bytes:
                        self._compact_quietly()
            except OSError as exc:
                raise LedgerError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    @contextmanager
    def _locked(self):
        fd = open_private(self._lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _compact_quietly(self) -> None:
        try:
            self._compact()
        except OSError as exc:  # the record is written; compaction is retried at the next append
            log.error("ledger: cannot compact %s: %s", self.path, exc.strerror or exc)

    def _compact(self) -> None:
        """Replace the ledger by the records that still matter (caller holds the lock, just refreshed)."""
        kept = sorted((at, line) for history in self._history.values() for at, line in _needed(history))
        marker = encode({"event": "compacted", "at": time.time(), "from_bytes": self._offset,
                         "previous": LEDGER_NAME + ".1"})
        temporary = self.path + ".compact"
        fd = create_new(temporary)
        try:
            write_all(fd, marker + b"".join(line for _, line in kept))
            os.fsync(fd)
        finally:
            os.close(fd)
        previous = self.path + ".1"
        try:
            unlink(previous)
        except FileNotFoundError:
            pass
        try:
            link(self.path, previous)         # the old file stays readable at .1 ...
        except OSError:                       # no hard links here: a moment without a ledger, which
            rename(self.path, previous)       # a reader takes as unreadable (no restart), not as empty
        replace(temporary, self.path)         # ... while the path switches atomically
        fsync_dir(self.state_dir)
        log.info("ledger: compacted %s (%d bytes) to %d records; the old file is %s",
                 self.path, self._offset, len(kept), previous)
        self._refresh()

    # -- reading ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Apply the lines appended since the last read (ours and other replicas')."""
        with self._mutex:
            try:
                self._refresh()
            except OSError as exc:
                raise LedgerError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    def _refresh(self) -> None:
        with os.fdopen(open_private(self.path, os.O_RDONLY), "rb") as handle:
            status = os.fstat(handle.fileno())
            file_id = (status.st_dev, status.st_ino)
            if file_id != self._file_id or status.st_size < self._offset:
                # compacted (by us or another replica) or replaced: its first lines hold everything
                self._file_id, self._offset, self._history = file_id, 0, {}
            handle.seek(self._offset)
            while True:
                raw = handle.readline(MAX_LINE)
                if not raw.endswith(b"\n"):
                    if len(raw) < MAX_LINE:
                        break  # end of file, or a line still being written (or torn): wait for it
                    rest = _skip_line(handle)
                    if rest is None:
                        break  # not even ended yet
                    self._offset += len(raw) + rest
                    log.warning("ledger: skipping an over-long line in %s", self.path)
                    continue
                self._offset += len(raw)
                self._apply(raw)

    def _apply(self, raw: bytes) -> None:
        if _DECISION in raw or not raw.strip():
            return
        try:
            record = json.loads(raw)
            event, target, at = record["event"], record["target"], float(record["at"])
        except (ValueError, KeyError, TypeError):
            if b'"event": "compacted"' not in raw:
                log.warning("ledger: ignoring an unreadable line in %s", self.path)
            return
        if not isinstance(target, str):
            return
        history = self._history.setdefault(target, TargetHistory())
        if event == "restart" and not record.get("dry_run"):
            if history.last_restart is None or at >= history.last_restart:
                history.last_restart, history.last_line = at, raw
                history.last_verdict = record.get("verdict")
            horizon = history.last_restart - self.keep - SKEW_MARGIN
            history.restarts = [(t, line) for t, line in history.restarts if t > horizon]
            if at > horizon:
                history.restarts.append((at, raw))
            if record.get("verdict") == "stalled" and (history.last_stall_restart is None
                                                       or at >= history.last_stall_restart):
                history.last_stall_restart = at
        elif event == "circuit_reset" and at >= history.reset_at:
            history.reset_at, history.reset_line = at, raw
        elif event == "recovered" and at >= history.recovered_at:
            history.recovered_at, history.recovered_line = at, raw
        elif event == "circuit_open" and at >= history.opened_at:
            history.opened_at, history.opened_line = at, raw
        elif event == "alert_only" and isinstance(record.get("key"), str):
            history.told[record["key"]] = str(record.get("incident"))
            history.told_lines = (history.told_lines + [(at, raw)])[-KEEP_TOLD:]
        elif event == "escalation" and isinstance(record.get("key"), str):
            history.escalated.add(record["key"])
            history.told_lines = (history.told_lines + [(at, raw)])[-KEEP_TOLD:]

    def told(self, target: str, key: str) -> str | None:
        """The incident of the alert_only record with this key (None: people not yet told)."""
        with self._mutex:
            history = self._history.get(target)
            return history.told.get(key) if history else None

    def escalated(self, target: str, key: str) -> bool:
        """Has the escalation with this key run (or begun) already?"""
        with self._mutex:
            history = self._history.get(target)
            return bool(history) and key in history.escalated

    def last_restart(self, target: str) -> float | None:
        with self._mutex:
            history = self._history.get(target)
            return history.last_restart if history else None

    def last_restart_verdict(self, target: str) -> str | None:
        """The verdict the last restart was made for (hung, stalled, startup_stuck)."""
        with self._mutex:
            history = self._history.get(target)
            return history.last_verdict if history else None

    def reset_at(self, target: str) -> float:
        with self._mutex:
            history = self._history.get(target)
            return history.reset_at if history else 0.0

    def last_stall_restart(self, target: str) -> float | None:
        """When the target was last restarted for a stall (a restart record with verdict stalled)."""
        with self._mutex:
            history = self._history.get(target)
            return history.last_stall_restart if history else None

    def opened(self, target: str, now: float, window: float) -> bool:
        """Did the policy open the target's circuit itself (a restart that did not heal a stall)
        within ``window``, and no operator reset it since?"""
        with self._mutex:
            history = self._history.get(target)
            return bool(history) and history.opened_at > max(now - window, history.reset_at)

    def restarts_counted(self, target: str, now: float, window: float) -> list[float]:
        """Restart attempts that count against the budget: in the window, after any reset."""
        with self._mutex:
            history = self._history.get(target)
            if not history:
                return []
            since = max(now - window, history.reset_at)
            return sorted(at for at, _ in history.restarts if at > since)

    def restarting(self, target: str, now: float, recovery: float) -> bool:
        """Is the target's last restart unsettled: less than ``recovery`` s ago, and its backend
        not seen healthy since (``limits.py`` defines this; a restart that failed counts too)?"""
        with self._mutex:
            history = self._history.get(target)
            if not history or history.last_restart is None:
                return False
            last = history.last_restart
            return now - last < recovery and history.recovered_at < last

    def restarts_since(self, since: float) -> list[tuple[float, str]]:
        """Every restart attempt after ``since``, of every target: (at, target), oldest first."""
        with self._mutex:
            return sorted((at, target) for target, history in self._history.items()
                          for at, _ in history.restarts if at > since)


def encode(record: dict) -> bytes:
    return (json.dumps(record, sort_keys=True, ensure_ascii=True) + "\n").encode()


def _needed(history: TargetHistory):
    yield from history.restarts
    if history.last_line and all(line != history.last_line for _, line in history.restarts):
        yield history.last_restart, history.last_line
    if history.reset_line:
        yield history.reset_at, history.reset_line
    if history.recovered_line:
        yield history.recovered_at, history.recovered_line
    if history.opened_line:
        yield history.opened_at, history.opened_line
    yield from history.told_lines  # a hung process told about is not told (or escalated) again


def _undo(fd: int, size: int) -> None:
    """Cut what a failed write left after ``size`` (a partial line would fuse with the next)."""
    try:
        os.ftruncate(fd, size)
    except OSError as exc:  # the next append cuts the torn tail instead
        log.error("ledger: cannot undo a partial write: %s", exc.strerror or exc)


def _cut_torn_tail(fd: int, path: str) -> int:
    """If the file does not end with a newline, cut it back to its last one; returns the size."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    os.fsync(fd)
    log.warning("ledger: cut a torn last line (%d bytes: a crash or a full disk mid-write) from %s",
                size - end, path)
    return end


def _skip_line(handle) -> int | None:
    """Read past the rest of an over-long line; the bytes skipped, or None if it has no end yet."""
    skipped = 0
    while True:
        chunk = handle.readline(MAX_LINE)
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            return skipped
        if len(chunk) < MAX_LINE:
            return None
