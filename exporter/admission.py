"""What the exporter's server admits, per peer address, and what a connection may ask of it.

A leaf: the server (``httpserver``) holds its connections (``httpconn``), and a connection asks
its server to admit, start and release its work. Naming that surface here, as ``Server``, with the
per-address record (``Peer``), the per-address caps and the counters, lets ``httpconn`` depend on
this leaf instead of reaching back into the server that made it (the ``httpconn``↔``httpserver``
circle of issue 34). Nothing here imports the server or a connection (only the wire types, ``httpwire``).
"""
from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .httpwire import Head, Request, Response, Route

__all__ = ["Peer", "Server", "ServerStats", "client_connection_cap", "client_slot_cap"]


@dataclass
class ServerStats:
    """Counters a face can export (this module imports no metrics library)."""

    connections_open: int = 0
    work_admitted: int = 0   # work requests admitted and not yet answered
    work_running: int = 0    # of which holding a slot now (on the loop or a worker)
    dropped: dict[str, int] = field(default_factory=lambda: {
        "read_timeout": 0, "evicted": 0, "refused": 0, "bad_request": 0})
    shed: int = 0      # work answered 503 because no worker was free in time

    @property
    def work_waiting(self) -> int:
        return max(0, self.work_admitted - self.work_running)


def client_connection_cap(max_connections: int) -> int:
    """One address may hold all but a sixty-fourth of the table: room for others to connect
    without evicting, while one Prometheus' burst of 1,000 scrapes fits a table of 1,024."""
    return max(1, max_connections - max(1, max_connections // 64))


def client_slot_cap(workers: int) -> int:
    """One address may hold all but an eighth of the work slots (a kubelet's /livez finds one
    free while another client keeps the rest busy); with fewer than 8, round-robin alone."""
    return max(1, workers - workers // 8)


class Peer:
    """One peer address: its connections (oldest first), the idle ones among them (evictable,
    oldest first), the work slots it holds and its work waiting for one (oldest first). The
    connections are the server's ``httpconn.Connection``s; this record only keeps them in order."""

    __slots__ = ("address", "connections", "idle", "running", "waiting")

    def __init__(self, address: str):
        self.address = address
        self.connections: dict[Any, None] = {}
        self.idle: OrderedDict[Any, None] = OrderedDict()
        self.running = 0
        self.waiting: OrderedDict[Any, None] = OrderedDict()


class Server(Protocol):
    """What one connection asks of the server that accepted it (``httpserver.BoundedHTTPServer``)."""

    loop: Any
    name: str
    read_timeout: float
    stats: ServerStats
    executor: Executor
    free_slots: int
    waiting: OrderedDict[Peer, None]

    def parsed(self, head: bytes) -> tuple[Head, bool]: ...
    def keep(self, head: bytes, parsed: Head) -> None: ...
    def answer_inline(self, request: Request) -> Response | Route: ...
    def may_start(self, client: Peer) -> bool: ...
    def run_work(self, work: Callable[[], Response], request: Request) -> Response: ...
    def start_waiting(self) -> None: ...
    def forget(self, connection: Any) -> None: ...
    def release(self, client: Peer) -> None: ...
