"""One client connection of the exporter's server, as an ``asyncio.Protocol`` (the shape uvicorn
gives httptools): read a head within ``read_timeout``, answer it (inline, or as awaited work
holding a slot), repeat while kept alive, close an idle one after ``IDLE_TIMEOUT``. Whatever the
client does — half-closes, pipelines, never reads its answers — costs its own connection at most,
never the loop. Every limit is ``admission``'s; heads are checked and parsed by ``httpwire``
(llhttp through httptools).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from .admission import IDLE_TIMEOUT, MAX_PIPELINED, Admission
from .httpwire import BadRequest, Head, Request, Response, Route, encode, head_length, plain

log = logging.getLogger("hangwatch.exporter.httpserver")


def log_failure(name: str, what: str, exc: BaseException) -> None:
    """One line per failed request (the traceback only at debug level): a client that can make a
    request fail must not be able to fill the log with tracebacks."""
    log.error("%s: %s failed: %s: %s", name, what, type(exc).__name__, exc,
              exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)


class Serving(Protocol):
    """What a connection asks of the server that accepted it."""

    name: str
    admission: Admission

    def answer_inline(self, request: Request) -> Response | Route: ...


class Connection(asyncio.Protocol):
    """One client connection. Every method runs on the loop."""

    def __init__(self, server: Serving):
        self.server = server
        self.admission = server.admission
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.client_record = None
        self.client = ""
        self.buffer = b""
        self.busy = False          # a request is being answered: not evictable, not taking a new one
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None
        self.reading_head = False  # bytes of a head have arrived (read_timeout applies)
        self.reading = True        # the transport reads
        self.blocked = False       # the client has not taken all of its last answer
        self.close_when_sent = False
        self.work: tuple[Route, Request] | None = None  # admitted work not yet answered
        self.task: asyncio.Task | None = None           # that work, holding a slot
        self.shed_timer: asyncio.TimerHandle | None = None
        self.keep_alive = True
        self.keep_alive_after = True   # False once the client has half-closed
        self.with_body = True          # False for HEAD
        self.head: tuple[bytes, Head] | None = None  # a head just parsed: kept if answered 200

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
            self.closed = True
            transport.abort()
            self.admission.release(self.client_record)
            return
        self._wait_for_head(self.admission.read_timeout, counted=True)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buffer += data
        if self.busy:
            # Reading goes on while the answer is worked on (what a client sends meanwhile is
            # kept, up to MAX_PIPELINED): pausing and resuming would cost two epoll_ctl per request.
            if len(self.buffer) > MAX_PIPELINED:
                self._read_off()
            return
        if not self.reading_head:
            self.reading_head = True
            self._arm(self.admission.read_timeout, counted=True)
        self._try_request()

    def eof_received(self) -> bool:
        """The client finished sending (a half-close): answer what it asked, then close."""
        self.keep_alive_after = False
        self.reading = False  # the transport stops reading at the end of the stream
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
        if self.closed:
            return
        if self.close_when_sent:
            self.close()
        elif not self.busy:
            self._wait_for_head(IDLE_TIMEOUT, counted=False)  # taken: read its next request

    # -- the transport --------------------------------------------------------------------------
    def _read_on(self) -> None:
        if not self.reading and not self.closed and self.keep_alive_after:
            self.reading = True
            self.transport.resume_reading()

    def _read_off(self) -> None:
        if self.reading and not self.closed:
            self.reading = False
            self.transport.pause_reading()

    def _request_waiting(self) -> bool:
        """A whole request (pipelined) is buffered: it is answered before a half-close closes."""
        return b"\r\n\r\n" in self.buffer

    def _send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        """Close once what is owed is sent (at most read_timeout more: the timer aborts)."""
        if self.closed:
            return
        if self.blocked:
            self.close_when_sent = True
            self._read_off()
            self._arm(self.admission.read_timeout, counted=False)
            return
        self.transport.close()
        self._gone()

    def abort(self) -> None:
        if self.closed:
            return
        self.transport.abort()
        self._gone()

    def _gone(self) -> None:
        """This connection is over (closed by either side): its timers, work and record go."""
        if self.closed:
            return
        self.closed = True
        self._disarm()
        if self.shed_timer is not None:
            self.shed_timer.cancel()
            self.shed_timer = None
        if self.admission.unqueue(self):  # still waiting for a slot: it never runs
            self.work = None
            self.admission.stats.work_admitted -= 1
        if self.task is not None:
            self.task.cancel()  # nobody will read its answer; its slot comes back when it ends
        self.admission.forget(self)

    # -- the request cycle ------------------------------------------------------------------------
    def _wait_for_head(self, timeout: float, counted: bool) -> None:
        self.busy = False
        self.reading_head = bool(self.buffer)
        self.client_record.idle[self] = None
        if self.blocked:  # the client has not read its last answer yet: it gets read_timeout to do so
            self._arm(self.admission.read_timeout, counted=False)
            return
        self._arm(self.admission.read_timeout if self.buffer else timeout, counted=counted or bool(self.buffer))
        self._read_on()
        if self.buffer:
            # A pipelined request: taken on the loop's next round, not by recursion (hundreds of
            # tiny requests in one read would otherwise nest a call chain per request).
            self.loop.call_soon(self._next_request)

    def _next_request(self) -> None:
        if not self.closed and not self.busy and not self.blocked and self.buffer:
            self._try_request()

    def _try_request(self) -> None:
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
            parsed, kept = self.admission.heads.parsed(head)
        except BadRequest as bad:
            self._fail(bad.status, bad.text)
            return
        self._disarm()
        self.busy, self.reading_head = True, False
        self.client_record.idle.pop(self, None)
        self.keep_alive = parsed.keep_alive
        self.with_body = parsed.method != "HEAD"
        self.head = None if kept else (head, parsed)
        request = Request(parsed.method, parsed.path, parsed.query, parsed.headers, time.monotonic(), self.client)
        answer = self.server.answer_inline(request)
        if isinstance(answer, Response):
            self._respond(answer)
        else:
            self._submit(answer, request)

    def _submit(self, route: Route, request: Request) -> None:
        admission = self.admission
        admission.stats.work_admitted += 1
        self.work = (route, request)
        if admission.may_start(self.client_record):
            self.start_work()
            return
        wait = max(0.0, route.start_within(request) - (time.monotonic() - request.received))
        admission.wait_for_slot(self)
        self.shed_timer = self.loop.call_later(wait, self._shed)

    def start_work(self) -> None:
        """A slot is free: the work starts, awaited on the loop."""
        if self.shed_timer is not None:
            self.shed_timer.cancel()
            self.shed_timer = None
        self.admission.unqueue(self)
        self.admission.take_slot(self.client_record)
        route, request = self.work
        self.task = self.loop.create_task(self._run(route, request))

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
        self.shed_timer = None
        if not self.admission.unqueue(self) or self.work is None:
            return
        route, request = self.work
        self.work = None
        self.admission.stats.work_admitted -= 1
        self.admission.stats.shed += 1
        if not self.closed:
            try:
                response = route.overloaded(request)
            except Exception as exc:
                log_failure(self.server.name, "overloaded answer", exc)
                response = plain(503, "overloaded\n")
            self._respond(response)

    def _work_done(self, response: Response | None) -> None:
        admission, client = self.admission, self.client_record
        self.task = None
        self.work = None
        admission.give_back(client)
        if not self.closed and response is not None:
            self._respond(response)
        elif self.closed:
            admission.release(client)
        admission.start_waiting()

    def _respond(self, response: Response) -> None:
        if self.head is not None:
            if response.status == 200:
                self.admission.heads.keep(*self.head)
            self.head = None
        self.keep_alive = self.keep_alive and (self.keep_alive_after or self._request_waiting())
        self._send(encode(response, self.keep_alive, self.with_body))
        if not self.keep_alive:
            self.close()
            return
        self._wait_for_head(IDLE_TIMEOUT, counted=False)

    def _fail(self, status: int, text: str) -> None:
        self.admission.stats.dropped["bad_request"] += 1
        log.debug("%s: %s from %s", self.server.name, text, self.client)
        self._send(encode(plain(status, text + "\n"), keep_alive=False))
        self.close()

    # -- timers -----------------------------------------------------------------------------------
    def _arm(self, timeout: float, counted: bool) -> None:
        self._disarm()
        self.timer = self.loop.call_later(timeout, self._timed_out, counted)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, counted: bool) -> None:
        self.timer = None
        if counted:
            self.admission.stats.dropped["read_timeout"] += 1
        self.abort()
