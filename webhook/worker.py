"""One job at a time per target, off the request thread, duplicates coalesced.

The re-check takes two intervals (20 s by default) and a restart up to ``stop_timeout``;
Alertmanager wants an answer within seconds and re-sends on its own schedule. So a request
only hands the job over: if a job for that target is already queued or running, the new
one is a duplicate and is dropped (the running one will decide for both). Different
targets run side by side, each in its own short-lived thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("hangwatch.webhook")


class Worker:
    def __init__(self, run: Callable[[object], None]):
        self._run = run
        self._busy: set[str] = set()
        self._changed = threading.Condition()

    def submit(self, key: str, job) -> bool:
        """Start ``job`` for ``key`` unless one is already in progress (then False: coalesced)."""
        with self._changed:
            if key in self._busy:
                return False
            self._busy.add(key)
        thread = threading.Thread(target=self._work, args=(key, job), name=f"hangwatch-job-{key}", daemon=True)
        thread.start()
        return True

    def _work(self, key: str, job) -> None:
        try:
            self._run(job)
        except Exception:  # the policy records its own errors; this is the last net
            log.exception("job for %s failed", key)
        finally:
            with self._changed:
                self._busy.discard(key)
                self._changed.notify_all()

    def in_progress(self) -> int:
        with self._changed:
            return len(self._busy)

    def wait_idle(self, timeout: float) -> bool:
        """True once no job is in progress; False if ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._busy, timeout)
