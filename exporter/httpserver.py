"""The exporter's HTTP server: bounded connections, work slots and waits, whatever its peers do.

A thread per connection (the standard library's server) lets a slow client hold a thread as long
as it likes; here one event loop (``new_event_loop``: uvloop where it installs) serves every
connection (``httpprotocol.Connection``), work is awaited on it, no peer address can starve
another of connections or work slots, and work that waits longer than its route allows is
answered 503 (every such rule: ``admission``). It knows nothing about the exporter: paths map to
``Route``s (docs/design.md, "Many backends, one exporter").
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Mapping

from hangwatch.streamwire import own_connections

from .admission import Admission, ServerStats
from .httpprotocol import Connection, log_failure
from .httpwire import Request, Response, Route, plain

__all__ = ["BoundedHTTPServer", "Request", "Response", "Route", "ServerStats", "new_event_loop"]

log = logging.getLogger("hangwatch.exporter.httpserver")

LISTEN_BACKLOG = 4096       # the kernel caps it at net.core.somaxconn
ALLOWED_METHODS = ("GET", "HEAD")
LOOPS = ("asyncio", "uvloop")


def loop_choice() -> str:
    """``HANGWATCH_LOOP`` (empty: not chosen); ValueError when it names no loop we know."""
    choice = os.environ.get("HANGWATCH_LOOP", "").strip().lower()
    if choice and choice not in LOOPS:
        raise ValueError(f"HANGWATCH_LOOP={choice!r}: expected one of {', '.join(LOOPS)}")
    return choice


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it installs, else asyncio's own; ``HANGWATCH_LOOP=asyncio|uvloop`` chooses."""
    choice = loop_choice()
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class BoundedHTTPServer:
    """An HTTP/1.1 server with bounded connections, slots and waits (see the module doc).

    The socketserver-like surface (``server_address``, ``serve_forever``, ``shutdown``,
    ``server_close``): binds in the constructor, so a bad address fails before anything runs;
    ``serve_forever`` runs the loop on the calling thread.
    """

    def __init__(self, address: tuple[str, int], routes: Mapping[str, Route], *, max_connections: int = 1024,
                 read_timeout: float = 5.0, workers: int = 64, name: str = "hangwatch",
                 max_client_connections: int | None = None, max_client_slots: int | None = None):
        self.routes = dict(routes)
        self.name = name
        self.admission = Admission(max_connections=max_connections, workers=workers, read_timeout=read_timeout,
                                   name=name, max_client_connections=max_client_connections,
                                   max_client_slots=max_client_slots)
        self.stats = self.admission.stats
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
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._running = threading.Event()
        self._entered = False
        self.abandoned = 0  # work still running when the loop stopped

    @property
    def max_client_connections(self) -> int:
        return self.admission.max_client_connections

    # -- lifecycle --------------------------------------------------------------------------
    def serve_forever(self) -> None:
        self._stopped.clear()
        self._entered = True
        loop = self.loop = new_event_loop()
        own_connections(loop)  # it runs as long as the server: a backend's connection may be its transport
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(loop.create_server(
                lambda: Connection(self), sock=self.socket, backlog=LISTEN_BACKLOG))
            self._running.set()
            loop.run_forever()
            server.close()
        finally:
            self._running.clear()
            self.abandoned = self.stats.work_running
            try:
                for connection in list(self.admission.connections):
                    connection.abort()
                _cancel_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait until it has returned."""
        if not self._entered:
            return
        self._running.wait(10)
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass  # closed meanwhile
            self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()

    # -- what a connection asks ----------------------------------------------------------------
    def answer_inline(self, request: Request) -> Response | Route:
        """The response for a request that needs no slot, or the route whose work it is."""
        if request.method not in ALLOWED_METHODS:
            return Response(405, "text/plain; charset=utf-8", b"only GET and HEAD\n", (("Allow", "GET, HEAD"),))
        route = self.routes.get(request.path)
        if route is None:
            return plain(404, "not found\n")
        if not route.inline:
            return route
        try:
            return route.handler(request)
        except Exception as exc:
            log_failure(self.name, f"{request.method} {request.path}", exc)
            return plain(500, "internal error (logged)\n")


def _cancel_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Work still running when the server stops is abandoned (Prometheus records a gap)."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
