"""Idle keep-alive connections, kept per origin and handed out again: the exporter reads the same
backends every scrape, and a new connection per reading costs a handshake and a socket. The rules
(a connection the server closed is never handed out; at most ``max_idle`` in all, the least
recently used origin giving one up first) are written once, here.

A server that ends idle connections before the caller comes back (uvicorn, so vLLM, after 5 s;
a scrape comes every 15 s) makes a kept connection cost more than a new one: its end wakes the
loop to be read and closed. Such an origin is remembered, and ``finished`` closes its
connections first, when the caller is done with it for a while (bench/RESULTS-busy-spread.md);
every ``RECHECK``-th time one is kept instead, so an origin found so once (a restart ends every
connection) gets its kept connections back when its server keeps them.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

Connection = TypeVar("Connection")
MAX_DROPPING = 4096  # origins remembered as ending idle connections (the least recently found go first)
RECHECK = 8          # closed first this many times, then one is kept again: does the server still end it?


class IdlePool(Generic[Connection]):
    """Up to ``max_idle`` idle connections (LRU by origin). ``usable(connection)``: the server has
    not closed it and it holds no stray bytes; ``close(connection)`` ends one. Thread-safe: a
    connection taken is the taker's alone until it is given back."""

    def __init__(self, max_idle: int, *, usable: Callable[[Connection], bool],
                 close: Callable[[Connection], None]):
        self.max_idle = max_idle
        self._usable, self._close = usable, close
        self._idle: OrderedDict[Hashable, list[Connection]] = OrderedDict()
        self._dropping: OrderedDict[Hashable, int] = OrderedDict()  # origin -> closes left before a recheck
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def take(self, origin: Hashable) -> Connection | None:
        """The most recently given back usable connection to ``origin`` (unusable ones are closed)."""
        with self._lock:
            connections = self._idle.get(origin)
            while connections:
                connection = connections.pop()
                self._count -= 1
                if not connections:
                    del self._idle[origin]
                if self._usable(connection):
                    return connection
                self._dropped(origin)
                self._close(connection)
                connections = self._idle.get(origin)
        return None

    def give_back(self, origin: Hashable, connection: Connection) -> None:
        if self.max_idle <= 0:
            self._close(connection)
            return
        evicted = []
        with self._lock:
            self._idle.setdefault(origin, []).append(connection)
            self._idle.move_to_end(origin)
            self._count += 1
            while self._count > self.max_idle:
                oldest_origin, oldest = next(iter(self._idle.items()))
                evicted.append(oldest.pop(0))
                self._count -= 1
                if not oldest:
                    del self._idle[oldest_origin]
        for connection in evicted:
            self._close(connection)

    def dropped(self, origin: Hashable) -> None:
        """``origin``'s server ended a connection that was kept idle (found so once taken)."""
        with self._lock:
            self._dropped(origin)

    def _dropped(self, origin: Hashable) -> None:
        self._dropping[origin] = RECHECK
        self._dropping.move_to_end(origin)
        if len(self._dropping) > MAX_DROPPING:
            self._dropping.popitem(last=False)

    def finished(self, origin: Hashable) -> None:
        """The caller is done with ``origin`` for a while: if its server has ended an idle
        connection before, the ones kept for it are closed now (kept every ``RECHECK``-th time)."""
        if origin not in self._dropping:
            return
        with self._lock:
            left = self._dropping.pop(origin, 0)
            if left <= 0:
                return  # kept this time: found ended again, the origin is remembered again
            self._dropping[origin] = left - 1
            connections = self._idle.pop(origin, ())
            self._count -= len(connections)
        for connection in connections:
            self._close(connection)

    def close(self, gone: Callable[[Hashable], bool] = lambda origin: True) -> None:
        """Close the idle connections to every origin (or to those ``gone`` says)."""
        with self._lock:
            dropped = [self._idle.pop(origin) for origin in [o for o in self._idle if gone(o)]]
            self._count -= sum(map(len, dropped))
        for connections in dropped:
            for connection in connections:
                self._close(connection)
