"""The webhook's memory: an append-only, fsync'd JSON-lines ledger, and per-target file locks.

Every decision is a line in ``state_dir/ledger.jsonl``; a restart is written *before* the
Docker call (so a crash mid-restart still counts against the budget). Cooldowns and budgets
are computed from the file, never from process memory alone: a restarted webhook, or a
second replica sharing the state_dir, reads what the others did (``refresh()`` picks up new
lines from where it stopped). ``TargetLock`` (``fcntl.flock`` on ``locks/<target>.lock``)
makes decide+restart for one target exclusive across processes.
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

log = logging.getLogger("hangwatch.webhook")

LEDGER_NAME = "ledger.jsonl"


@dataclass
class TargetHistory:
    restarts: list[float] = field(default_factory=list)   # wall times of restart attempts
    reset_at: float = 0.0                                  # last operator circuit reset


class Ledger:
    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, LEDGER_NAME)
        os.makedirs(os.path.join(state_dir, "incidents"), exist_ok=True)
        os.makedirs(os.path.join(state_dir, "locks"), exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._offset = 0
        self._history: dict[str, TargetHistory] = {}
        self._mutex = threading.Lock()
        self.refresh()

    def close(self) -> None:
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def append(self, record: dict) -> None:
        """Write one line durably (flock'd: replicas append to the same file), then re-read."""
        line = (json.dumps(record, sort_keys=True, ensure_ascii=True) + "\n").encode()
        with self._mutex:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                os.write(self._fd, line)
                os.fsync(self._fd)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.refresh()

    def refresh(self) -> None:
        """Apply the lines appended since the last read (ours and other replicas')."""
        with self._mutex:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1  # a line being written by another replica waits
            for raw in data[:end].splitlines():
                self._apply(raw)
            self._offset += end

    def _apply(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
            event, target, at = record["event"], record["target"], float(record["at"])
        except (ValueError, KeyError, TypeError):
            if raw.strip():
                log.warning("ledger: ignoring an unreadable line in %s", self.path)
            return
        if event == "restart" and not record.get("dry_run"):
            self._history.setdefault(target, TargetHistory()).restarts.append(at)
        elif event == "circuit_reset":
            history = self._history.setdefault(target, TargetHistory())
            history.reset_at = max(history.reset_at, at)

    def last_restart(self, target: str) -> float | None:
        with self._mutex:
            history = self._history.get(target)
            return max(history.restarts) if history and history.restarts else None

    def restarts_counted(self, target: str, now: float, window: float) -> list[float]:
        """Restart attempts that count against the budget: in the window, after any reset."""
        with self._mutex:
            history = self._history.get(target)
            if not history:
                return []
            since = max(now - window, history.reset_at)
            return [at for at in history.restarts if at > since]


@contextmanager
def target_lock(state_dir: str, target: str, *, deadline: float, poll: float = 0.05):
    """Hold ``locks/<target>.lock`` exclusively (across processes); TimeoutError after ``deadline`` s."""
    path = os.path.join(state_dir, "locks", f"{target}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        give_up = time.monotonic() + deadline
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise TimeoutError(f"lock {path} held elsewhere for {deadline:g}s") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def write_incident(state_dir: str, name: str, record: dict) -> str:
    """Write ``incidents/<name>.json`` atomically and durably; returns its path."""
    directory = os.path.join(state_dir, "incidents")
    path = os.path.join(directory, f"{name}.json")
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path
