"""What the exporter keeps between scrapes besides idle connections — engine versions — and why
it is no state a reading depends on.

Every reading is still taken afresh (design.md, "Why the exporter keeps no state"); the
version only labels ``hangwatch_backend_info``. ``VersionCache``: the engine's version
(``/version``) per target and process start time. A process cannot change its version without
restarting, and a restart changes ``process_start_time_seconds``, so a cached version is never
stale; a page without a start time (multiprocess mode) is asked every time it answers. At most
``VERSIONS`` entries. (Idle keep-alive connections to the backends are ``hangwatch.client.Client``'s.)

A version that could not be read (no answer, an error, an empty or non-JSON body) is asked again
with back-off — ``RETRY_FIRST_S`` doubling to ``RETRY_MAX_S`` per target, engine and process —
not on every scrape: an empty ``/version`` once made every scrape of that backend two requests.
A restart (a new start time) is a new process and is asked at once.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

VERSIONS = 20000     # ~150 bytes each
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 600.0


class VersionCache:
    def __init__(self, capacity: int = VERSIONS, clock: Callable[[], float] = time.monotonic):
        self.capacity = capacity
        self.clock = clock
        self._lock = threading.Lock()
        self._versions: OrderedDict[tuple[str, str, float], str] = OrderedDict()
        # (target, engine, process start or None) -> (when to ask again, the next back-off)
        self._failed: OrderedDict[tuple[str, str, float | None], tuple[float, float]] = OrderedDict()

    def get(self, target: str, engine: str, process_start: float | None) -> str | None:
        if process_start is None:
            return None
        with self._lock:
            return self._versions.get((target, engine, process_start))

    def backing_off(self, target: str, engine: str, process_start: float | None) -> bool:
        """True while an unread version of this process is not to be asked again yet."""
        with self._lock:
            failed = self._failed.get((target, engine, process_start))
        return failed is not None and self.clock() < failed[0]

    def put(self, target: str, engine: str, process_start: float | None, version: str | None) -> None:
        if version is None:
            self._failure((target, engine, process_start))
            return
        with self._lock:
            self._failed.pop((target, engine, process_start), None)
        if process_start is None:
            return  # no identity to key a version on: ask again next scrape
        with self._lock:
            self._versions[(target, engine, process_start)] = version
            self._versions.move_to_end((target, engine, process_start))
            while len(self._versions) > self.capacity:
                self._versions.popitem(last=False)

    def _failure(self, key: tuple[str, str, float | None]) -> None:
        with self._lock:
            _, delay = self._failed.get(key, (0.0, RETRY_FIRST_S))
            self._failed[key] = (self.clock() + delay, min(delay * 2, RETRY_MAX_S))
            self._failed.move_to_end(key)
            while len(self._failed) > self.capacity:
                self._failed.popitem(last=False)
