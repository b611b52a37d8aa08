"""The exporter's HTTP server: bounded connections, threads and waits, whatever its peers do.

A thread per connection (the standard library's server) lets a slow client hold a thread as long
as it likes; here one loop reads every connection (``httpconn``), no peer address can starve
another of connections or work slots, and work that waits longer than its route allows is
answered 503. It knows nothing about the exporter: paths map to ``Route``s (docs/design.md,
"Many backends, one exporter").
"""
from __future__ import annotations

import errno
import socket
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Callable, Mapping

from .admission import Peer, ServerStats, client_connection_cap, client_slot_cap
from .evloop import Loop
from .httpconn import Connection, log, log_failure
from .httpwire import Head, Request, Response, Route, parse_head, plain

__all__ = ["BoundedHTTPServer", "Request", "Response", "Route", "ServerStats"]

LISTEN_BACKLOG = 4096       # the kernel caps it at net.core.somaxconn
ACCEPTS_PER_WAKE = 64
# Heads answered 200 are kept parsed (Prometheus sends each target the same head every scrape):
# only heads of at most MAX_KEPT_HEAD bytes, KEPT_HEADS_BYTES of them in all (oldest out first).
# A head on an unknown path, or with a query its route refused, is never kept.
MAX_KEPT_HEAD = 1024
KEPT_HEADS_BYTES = 4 * 1024 * 1024
KEPT_HEAD_OVERHEAD = 1024   # what a kept head costs beside its bytes (its Head, dict, strings)
ALLOWED_METHODS = ("GET", "HEAD")


class BoundedHTTPServer:
    """An HTTP/1.1 server with bounded connections, threads and waits (see the module doc).

    The socketserver-like surface (``server_address``, ``serve_forever``, ``shutdown``,
    ``server_close``): binds in the constructor, so a bad address fails before anything runs.
    """

    def __init__(self, address: tuple[str, int], routes: Mapping[str, Route], *, max_connections: int = 1024,
                 read_timeout: float = 5.0, workers: int = 64, name: str = "hangwatch",
                 max_client_connections: int | None = None, max_client_slots: int | None = None):
        self.routes = dict(routes)
        self.max_connections, self.read_timeout, self.workers = max_connections, read_timeout, workers
        self.max_client_connections = max_client_connections or client_connection_cap(max_connections)
        self.max_client_slots = max_client_slots or client_slot_cap(workers)
        self.stats = ServerStats()
        self.name = name
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(LISTEN_BACKLOG)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()[:2]
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-worker")
        self.loop: Loop | None = None
        self._stopped = threading.Event()
        self._running = threading.Event()
        self._entered = False
        self.connections: set[Connection] = set()
        self.clients: dict[str, Peer] = {}
        self.free_slots = workers  # work being done now, on the loop or a thread (loop thread only)
        self.waiting: OrderedDict[Peer, None] = OrderedDict()  # clients with waiting work, round-robin
        self._starting = False     # start_waiting is running (it is never entered twice)
        self.kept_heads: OrderedDict[bytes, Head] = OrderedDict()  # see KEPT_HEADS_BYTES
        self.kept_heads_bytes = 0

    # -- lifecycle --------------------------------------------------------------------------
    def serve_forever(self) -> None:
        self._stopped.clear()
        self._entered = True
        loop = self.loop = Loop()
        listening = self.socket.fileno()
        try:
            loop.add_reader(listening, self._accept)
            self._running.set()
            loop.run_forever()
        finally:
            self._running.clear()
            for connection in list(self.connections):
                connection.abort()
            loop.close()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait until it has returned."""
        if not self._entered:
            return
        self._running.wait(10)
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.stop_threadsafe()
            self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        """New connections (a few at a time, so a flood cannot starve the answers)."""
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, peer = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: accepting again at once would spin. As asyncio does,
                    # stop accepting for a second (the backlog holds the rest meanwhile).
                    log.warning("%s: cannot accept a connection (%s); pausing accepts for 1 s", self.name,
                                exc.strerror)
                    listening = self.socket.fileno()
                    self.loop.remove_reader(listening)
                    self.loop.call_later(1.0, self._resume_accepting)
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            address = peer[0] if isinstance(peer, tuple) else ""
            client = self.clients.get(address)
            if client is None:
                client = self.clients[address] = Peer(address)
            connection = Connection(self, sock, client, f"{address}:{peer[1]}" if isinstance(peer, tuple) else "")
            if not self.admit(connection):
                sock.close()
                self.release(client)
                continue
            connection.start()

    def _resume_accepting(self) -> None:
        if self.socket.fileno() != -1 and self._running.is_set():
            self.loop.add_reader(self.socket.fileno(), self._accept)

    # -- bookkeeping the connections use --------------------------------------------------------
    def admit(self, connection: "Connection") -> bool:
        """Room for one more connection (see the module doc: the biggest holder gives way)."""
        client = connection.client_record
        if len(client.connections) >= self.max_client_connections:
            if not self._evict_from(client, busy_too=False):
                self.stats.dropped["refused"] += 1
                return False
        elif len(self.connections) >= self.max_connections:
            biggest = max(self.clients.values(), key=lambda c: len(c.connections))
            if len(biggest.connections) > len(client.connections):
                evicted = self._evict_from(biggest, busy_too=True)
            else:  # the newcomer's own address holds the most: only its own idle one may go
                evicted = self._evict_from(client, busy_too=False)
            if not evicted:
                self.stats.dropped["refused"] += 1
                return False
        self.connections.add(connection)
        client.connections[connection] = None
        self.stats.connections_open = len(self.connections)
        return True

    def _evict_from(self, client: Peer, busy_too: bool) -> bool:
        """Close the client's oldest idle connection, else (``busy_too``) its oldest one."""
        victim = next(iter(client.idle), None)
        if victim is None and busy_too:
            victim = next(iter(client.connections), None)
        if victim is None:
            return False
        self.stats.dropped["evicted"] += 1
        victim.abort()
        return True

    def forget(self, connection: "Connection") -> None:
        client = connection.client_record
        self.connections.discard(connection)
        client.connections.pop(connection, None)
        client.idle.pop(connection, None)
        self.stats.connections_open = len(self.connections)
        self.release(client)

    def release(self, client: Peer) -> None:
        """Drop an address's record once nothing of it is left (its slots included: a client
        that closes its connections still holds the slots their work runs in)."""
        if not client.connections and not client.running and not client.waiting:
            if self.clients.get(client.address) is client:
                del self.clients[client.address]

    def answer_inline(self, request: Request) -> Response | Route:
        """The response for a request that needs no worker, or the route that does."""
        if request.method not in ALLOWED_METHODS:
            return Response(405, "text/plain; charset=utf-8", b"only GET and HEAD\n", (("Allow", "GET, HEAD"),))
        route = self.routes.get(request.path)
        if route is None:
            return plain(404, "not found\n")
        if not route.inline:
            return route
        return self.call(route, request)

    def call(self, route: Route, request: Request) -> Response:
        try:
            return route.handler(request)
        except Exception as exc:
            log_failure(self.name, f"{request.method} {request.path}", exc)
            return plain(500, "internal error (logged)\n")

    def run_work(self, work: Callable[[], Response], request: Request) -> Response:
        """On a worker thread."""
        try:
            return work()
        except Exception as exc:
            log_failure(self.name, f"{request.method} {request.path}", exc)
            return plain(500, "internal error (logged)\n")

    def parsed(self, head: bytes) -> tuple[Head, bool]:
        """``parse_head(head)``, and whether it came from the kept heads."""
        known = self.kept_heads.get(head)
        if known is not None:
            return known, True
        return parse_head(head), False

    def keep(self, head: bytes, parsed: Head) -> None:
        """Keep a head its route answered 200 (bounded in bytes: see KEPT_HEADS_BYTES)."""
        if len(head) > MAX_KEPT_HEAD or head in self.kept_heads:
            return
        kept = self.kept_heads
        kept[head] = parsed._replace(headers=MappingProxyType(parsed.headers))  # shared: read-only
        self.kept_heads_bytes += len(head) + KEPT_HEAD_OVERHEAD
        while self.kept_heads_bytes > KEPT_HEADS_BYTES:
            oldest, _ = kept.popitem(last=False)
            self.kept_heads_bytes -= len(oldest) + KEPT_HEAD_OVERHEAD

    def may_start(self, client: Peer) -> bool:
        return self.free_slots > 0 and client.running < self.max_client_slots

    def start_waiting(self) -> None:
        """Give free slots to waiting work, one address after another (on the loop). Never
        entered twice: work answered at once frees its slot inside ``start_work``, and the loop
        here, not a nested call, gives that slot on (600 such answers would otherwise nest 600
        calls deep and break the interpreter's recursion limit half-way, losing slots)."""
        if self._starting:
            return
        self._starting = True
        try:
            while self.free_slots > 0 and self.waiting:
                started = False
                for _ in range(len(self.waiting)):
                    if self.free_slots <= 0:
                        break
                    client, _ = self.waiting.popitem(last=False)
                    if not client.waiting:
                        continue
                    if client.running >= self.max_client_slots:
                        self.waiting[client] = None  # its turn comes when one of its slots frees
                        continue
                    connection, _ = client.waiting.popitem(last=False)
                    if client.waiting:
                        self.waiting[client] = None  # to the back of the round
                    started = True
                    try:
                        connection.start_work()
                    except Exception as exc:  # the server's own bug: that connection, not the loop
                        log_failure(self.name, "starting work", exc)
                        connection.abort()
                if not started:
                    break
        finally:
            self._starting = False
