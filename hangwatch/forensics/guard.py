"""At most one capture per target per interval, whoever asks: ``/forensics``, ``/livez``, the webhook.

A capture ptraces every process of a server; asked in a loop it would pause (``--native``) or
slow the server it is meant to rescue. One guard object, keyed by the canonical target URL
(``targets.canonical_url``), is shared by every route of one exporter: a capture already
running is ``busy`` (503: try again), one that ended less than ``min_interval`` ago is
``too_soon`` (429, with the seconds to wait).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

MIN_INTERVAL = 60.0  # seconds between two captures of one target, by default


@dataclass(frozen=True)
class Refusal:
    code: int            # 503 busy, 429 too soon
    why: str
    retry_after: int     # whole seconds


class CaptureGuard:
    def __init__(self, min_interval: float = MIN_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.min_interval = min_interval
        self.clock = clock
        self._mutex = threading.Lock()
        self._running: set[str] = set()
        self._last: dict[str, float] = {}

    def claim(self, key: str) -> Refusal | None:
        """None: ``key`` is now being captured (call ``release`` after); else why not."""
        with self._mutex:
            if key in self._running:
                return Refusal(503, "a capture of this target is under way", 1)
            last = self._last.get(key)
            now = self.clock()
            if last is not None and now - last < self.min_interval:
                wait = self.min_interval - (now - last)
                return Refusal(429, f"this target was captured {now - last:.0f}s ago; one capture per "
                                    f"{self.min_interval:g}s", max(1, int(wait + 0.999)))
            self._running.add(key)
            return None

    def release(self, key: str) -> None:
        with self._mutex:
            self._running.discard(key)
            self._last[key] = self.clock()

    @contextmanager
    def holding(self, key: str):
        """``with guard.holding(key) as refusal:`` — refusal is None when the capture may run."""
        refusal = self.claim(key)
        try:
            yield refusal
        finally:
            if refusal is None:
                self.release(key)
