"""The exporter's HTTP server: bounded connections, work slots and waits, whatever its peers do.

A thread per connection (the standard library's server) lets a slow client hold a thread as long
as it likes; here one event loop (``new_event_loop``: uvloop where it installs) serves every
connection as an ``asyncio.Protocol`` (the shape uvicorn gives httptools), work is awaited on it,
and whatever a client does — half-closes, pipelines, never reads its answers — costs its own
connection at most, never the loop. Every limit is ``admission``'s; heads are read by
``httpwire``. It knows nothing about the exporter: paths map to ``Route``s (docs/design.md,
"Many backends, one exporter").
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import threading
import time
from typing import Callable, Mapping

from .admission import IDLE_TIMEOUT, MAX_PIPELINED, Admission
from .httpwire import BadRequest, Request, Response, Route, encode, head_length, plain

__all__ = ["BoundedHTTPServer", "Request", "Response", "Route", "new_event_loop"]

log = logging.getLogger("hangwatch.exporter.httpserver")

LISTEN_BACKLOG = 4096       # the kernel caps it at net.core.somaxconn
LOOPS = ("asyncio", "uvloop")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it installs, else asyncio's own; ``HANGWATCH_LOOP=asyncio|uvloop`` chooses
    (ValueError when it names no loop we know)."""
    choice = os.environ.get("HANGWATCH_LOOP", "").strip().lower()
    if choice and choice not in LOOPS:
        raise ValueError(f"HANGWATCH_LOOP={choice!r}: expected one of {', '.join(LOOPS)}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def log_failure(name: str, what: str, exc: BaseException) -> None:
    """One line per failed request (the traceback only at debug level): a client that can make a
    request fail must not be able to fill the log with tracebacks."""
    log.error("%s: %s failed: %s: %s", name, what, type(exc).__name__, exc,
              exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)


class BoundedHTTPServer:
    """The socketserver-like surface (``server_address``, ``serve_forever``, ``shutdown``,
    ``server_close``): binds in the constructor, so a bad address fails before anything runs;
    ``serve_forever`` runs the loop on the calling thread."""

    def __init__(self, address: tuple[str, int], routes: Mapping[str, Route], *, max_connections: int = 1024,
                 read_timeout: float = 5.0, workers: int = 64, name: str = "hangwatch",
                 max_client_connections: int | None = None, max_client_slots: int | None = None):
        self.routes = dict(routes)
        self.name = name
        self.admission = Admission(max_connections=max_connections, workers=workers, read_timeout=read_timeout,
                                   max_client_connections=max_client_connections, max_client_slots=max_client_slots)
        self.stats = self.admission  # its counters
        self.max_client_connections = self.admission.max_client_connections
        # (Not socket.create_server: its bind error repeats the address the caller already names.)
        self.socket = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
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
        self._running = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self.abandoned = 0  # work still running when the loop stopped

    def serve_forever(self) -> None:
        self._stopped.clear()
        loop = self.loop = new_event_loop()
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
                # Work still running is abandoned (Prometheus records a gap).
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait until it has returned."""
        if self._stopped.is_set():
            return
        self._running.wait(10)
        loop = self.loop
        if loop is not None:  # (None: making it failed)
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass  # closed meanwhile
            self._stopped.wait(10)

    def server_close(self) -> None:
        self.socket.close()


class Connection(asyncio.Protocol):
    """One client connection: a head read within ``read_timeout``, answered (inline, or as awaited
    work holding a slot), again while kept alive; closed when idle for ``IDLE_TIMEOUT``. Every
    method runs on the loop."""

    def __init__(self, server: BoundedHTTPServer):
        self.server = server
        self.admission = server.admission
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.client_record = None
        self.client = ""
        self.buffer = b""
        self.busy = False          # a request is being answered: not evictable, not taking a new one
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None  # the one deadline: a head, an idle wait, a slot, a send
        self.blocked = False       # the client has not taken all of its last answer
        self.keep_alive_after = True   # False once the client has half-closed
        self.work: tuple[Route, Request] | None = None  # admitted work not yet answered
        self.task: asyncio.Task | None = None           # that work
        self.holding = False       # that work holds a slot (it gives it back while paused)
        self.head = None           # (bytes, parsed Head) being answered: kept if answered 200

    # -- asyncio's calls ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        # Anything left unsent pauses this connection (pause_writing): one answer is kept for a
        # client that does not read, never one per request it sends.
        transport.set_write_buffer_limits(high=0, low=0)
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else ""
        self.client = f"{address}:{peer[1]}" if isinstance(peer, tuple) else ""
        self.client_record = self.admission.peer(address)
        if not self.admission.admit(self):
            self.abort()
            return
        self.client_record.idle[self] = None
        self._arm(self.admission.read_timeout, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        first_bytes = not self.buffer  # of a head: read_timeout applies from here
        self.buffer += data
        if self.busy:
            # Reading goes on while the answer is worked on (what a client sends meanwhile is
            # kept, up to MAX_PIPELINED): pausing and resuming would cost two epoll_ctl per request.
            if len(self.buffer) > MAX_PIPELINED:
                self._read_off()
            return
        if first_bytes:
            self._arm(self.admission.read_timeout, self._head_timed_out)
        self._try_request()

    def eof_received(self) -> bool:
        """The client finished sending (a half-close): answer what it asked, then close."""
        self.keep_alive_after = False  # (the transport has stopped reading: it must not start again)
        if not self.busy and not self._request_waiting():
            self.close()
        return True  # keep the transport open for the answers still owed

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone()

    def pause_writing(self) -> None:
        self.blocked = True
        self._read_off()  # no new request is read until the client has taken its answer

    def resume_writing(self) -> None:
        self.blocked = False
        if not self.closed and not self.busy and not self.transport.is_closing():
            self._wait_for_head()  # taken: read its next request

    # -- the transport --------------------------------------------------------------------------
    def _read_on(self) -> None:
        """(Pausing and resuming are no-ops when already so; resuming after the client's EOF would
        read that EOF again.)"""
        if not self.closed and self.keep_alive_after:
            self.transport.resume_reading()

    def _read_off(self) -> None:
        if not self.closed:
            self.transport.pause_reading()

    def _request_waiting(self) -> bool:
        """A whole request (pipelined) is buffered: it is answered before a half-close closes."""
        return b"\r\n\r\n" in self.buffer

    def close(self) -> None:
        """Close once what is owed is sent: the transport flushes first, and a client that does
        not take it within read_timeout is aborted."""
        if self.closed:
            return
        self.transport.close()
        if self.blocked:
            self._arm(self.admission.read_timeout, self.abort)  # else connection_lost: _gone
        else:
            self._gone()

    def abort(self) -> None:
        if not self.closed:
            self.transport.abort()
            self._gone()

    def _gone(self) -> None:
        """This connection is over (closed by either side): its timer, work and record go."""
        if self.closed:
            return
        self.closed = True
        self._disarm()
        self.admission.unqueue(self)  # still waiting for a slot: it never runs
        if self.task is not None:
            work = self.task.get_coro()
            self.task.cancel()  # nobody will read its answer; its slot comes back when it ends
            if inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
                self._work_done(None)  # it never started: a coroutine cancelled so never runs its body
        self.admission.forget(self)

    # -- the request cycle ------------------------------------------------------------------------
    def _wait_for_head(self) -> None:
        self.busy = False
        self.client_record.idle[self] = None
        if self.blocked:  # the client has not read its last answer yet: it gets read_timeout to do so
            self._arm(self.admission.read_timeout, self.abort)
            return
        self._read_on()
        if not self.buffer:
            self._arm(IDLE_TIMEOUT, self.abort)
        else:  # bytes of the next head are here: it is due within read_timeout
            self._arm(self.admission.read_timeout, self._head_timed_out)
            # A pipelined request: taken on the loop's next round, not by recursion (hundreds of
            # tiny requests in one read would otherwise nest a call chain per request).
            self.loop.call_soon(self._try_request)

    def _try_request(self) -> None:
        if self.closed or self.busy or self.blocked or not self.buffer:
            return  # (a pipelined request's turn may come after any of these)
        try:
            self._take_request()
        except Exception as exc:  # the server's own bug: one line, a 500, this connection closed
            log_failure(self.server.name, "reading a request", exc)
            if not self.closed and not self.busy:
                self._fail(500, "internal error (logged)")

    def _take_request(self) -> None:
        try:
            length = head_length(self.buffer)
            if not length:
                return
            head, self.buffer = self.buffer[:length], self.buffer[length:]
            parsed = self.admission.heads.parsed(head)
        except BadRequest as bad:
            self._fail(bad.status, bad.text)
            return
        self._disarm()
        self.busy = True
        self.client_record.idle.pop(self, None)
        self.head = (head, parsed)
        request = Request(parsed.method, parsed.path, parsed.query, parsed.headers, time.monotonic(), self.client, self)
        route = self.server.routes.get(request.path)
        if request.method not in ("GET", "HEAD"):
            self._respond(Response(405, "text/plain; charset=utf-8", b"only GET and HEAD\n", (("Allow", "GET, HEAD"),)))
        elif route is None:
            self._respond(plain(404, "not found\n"))
        elif route.inline:
            try:
                response = route.handler(request)
            except Exception as exc:
                log_failure(self.server.name, f"{request.method} {request.path}", exc)
                response = plain(500, "internal error (logged)\n")
            self._respond(response)
        else:
            self._submit(route, request)

    def _submit(self, route: Route, request: Request) -> None:
        self.work = (route, request)
        if self.admission.may_start(self.client_record):
            self.start_work()
            return
        wait = max(0.0, route.start_within(request) - (time.monotonic() - request.received))
        self.admission.wait_for_slot(self)
        self._arm(wait, self._shed)

    def start_work(self) -> None:
        """A slot is free: the work starts, awaited on the loop."""
        self._disarm()
        self.admission.take_slot(self)
        self.holding = True
        self.task = self.loop.create_task(self._run(*self.work))

    async def pause(self, seconds: float, within: float) -> bool:
        """``httpwire.Slot.pause``. A wait is not work: 64 idle probes holding every slot through
        their confirmation's sleep answered a burst of 1,000 probes 503 (bench/RESULTS-busy-spread.md)."""
        self._give_back()
        await asyncio.sleep(seconds)
        self.holding = await self.admission.retake(self.client_record, within)
        return self.holding

    def release(self) -> None:
        """``httpwire.Slot.release`` (a /livez awaiting a shared check that sleeps between readings)."""
        self._give_back()

    def _give_back(self) -> None:
        if self.holding:
            self.holding = False
            self.admission.give_back(self.client_record)

    async def _run(self, route: Route, request: Request) -> None:
        response = None
        try:
            response = await route.handler(request)
        except asyncio.CancelledError:
            pass  # the connection went (or the server stopped): nobody reads an answer
        except Exception as exc:
            log_failure(self.server.name, f"{request.method} {request.path}", exc)
            response = plain(500, "internal error (logged)\n")
        finally:
            self._work_done(response)

    def _shed(self) -> None:
        """No slot came free within the route's wait: the work never runs; answer overloaded."""
        self.admission.unqueue(self)
        route, request = self.work
        self.work = None
        try:
            response = route.overloaded(request)
        except Exception as exc:
            log_failure(self.server.name, "overloaded answer", exc)
            response = plain(503, "overloaded\n")
        self._respond(response)

    def _work_done(self, response: Response | None) -> None:
        self.task = self.work = None
        if not self.closed and response is not None:
            self._respond(response)
        self._give_back()

    def _respond(self, response: Response) -> None:
        head, parsed = self.head
        if response.status == 200:
            self.admission.heads.keep(head, parsed)
        keep_alive = parsed.keep_alive and (self.keep_alive_after or self._request_waiting())
        self.transport.write(encode(response, keep_alive, parsed.method != "HEAD"))
        if keep_alive:
            self._wait_for_head()
        else:
            self.close()

    def _fail(self, status: int, text: str) -> None:
        self.admission.dropped["bad_request"] += 1
        log.debug("%s: %s from %s", self.server.name, text, self.client)
        self.transport.write(encode(plain(status, text + "\n"), keep_alive=False))
        self.close()

    # -- the one timer ------------------------------------------------------------------------------
    def _arm(self, timeout: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer = self.loop.call_later(timeout, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _head_timed_out(self) -> None:
        """A head that did not come whole within read_timeout (a slow-loris): counted, cut off."""
        self.admission.dropped["read_timeout"] += 1
        self.abort()
