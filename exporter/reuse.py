"""What the exporter keeps between scrapes besides idle connections — engine versions — and why
it is no state a reading depends on.

Every reading is still taken afresh (design.md, "Why the exporter keeps no state"); the
version only labels ``hangwatch_backend_info``. ``VersionCache``: the engine's version
(``/version``) per target and process start time. A process cannot change its version without
restarting, and a restart changes ``process_start_time_seconds``, so a cached version is never
stale; a page without a start time (multiprocess mode) is asked every time. At most
``VERSIONS`` entries. (Idle keep-alive connections to the backends are ``hangwatch.fetch.Client``'s.)
"""
from __future__ import annotations

import threading
from collections import OrderedDict

VERSIONS = 20000     # ~150 bytes each


class VersionCache:
    def __init__(self, capacity: int = VERSIONS):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._versions: OrderedDict[tuple[str, str, float], str] = OrderedDict()

    def get(self, target: str, engine: str, process_start: float | None) -> str | None:
        if process_start is None:
            return None
        with self._lock:
            return self._versions.get((target, engine, process_start))

    def put(self, target: str, engine: str, process_start: float | None, version: str | None) -> None:
        if process_start is None or version is None:
            return  # no identity to key on, or nothing learned: ask again next scrape
        with self._lock:
            self._versions[(target, engine, process_start)] = version
            self._versions.move_to_end((target, engine, process_start))
            while len(self._versions) > self.capacity:
                self._versions.popitem(last=False)
