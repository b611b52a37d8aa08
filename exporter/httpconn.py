"""One client connection of the exporter's server on a non-blocking socket: read a head within
``read_timeout``, answer it (inline, on the loop, or from a worker), repeat while kept alive, and
close an idle one after ``IDLE_TIMEOUT``. Whatever the client does — half-closes, pipelines, never
reads its answers — costs its own connection at most, never the loop.
"""
from __future__ import annotations

import logging
import socket
import time

from .admission import Peer, Server
from .evloop import Loop
from .httpwire import MAX_HEAD_BYTES, BadRequest, Head, Request, Response, Route, encode, head_length, plain

log = logging.getLogger("hangwatch.exporter.httpserver")

IDLE_TIMEOUT = 120.0        # an idle keep-alive connection (Prometheus keeps them 5 min)
RECV_BYTES = 65536


def log_failure(name: str, what: str, exc: BaseException) -> None:
    """One line per failed request (the traceback only at debug level): a client that can make a
    request fail must not be able to fill the log with tracebacks."""
    log.error("%s: %s failed: %s: %s", name, what, type(exc).__name__, exc,
              exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)


class Connection:
    """One client connection on a non-blocking socket: read a head (within read_timeout),
    answer, repeat (keep-alive). Every method runs on the loop's thread."""

    def __init__(self, server: Server, sock: socket.socket, client: Peer, name: str):
        self.server = server
        self.loop = server.loop
        self.sock = sock
        self.fd = sock.fileno()
        self.client_record = client
        self.client = name
        self.buffer = b""
        self.busy = False          # a request is being answered: not evictable, not taking a new one
        self.closed = False
        self.timer = None
        self.reading_head = False  # bytes of a head have arrived (read_timeout applies)
        self.reading = False       # the loop watches the socket for bytes
        self.out = b""             # the part of an answer the socket had no room for yet
        self.close_when_sent = False
        self.work: tuple[Route, Request] | None = None  # admitted work not yet answered
        self.running = False                # that work holds a slot
        self.shed_timer = None
        self.keep_alive = True
        self.keep_alive_after = True   # False once the client has half-closed
        self.with_body = True          # False for HEAD
        self.head: tuple[bytes, Head] | None = None  # a head just parsed: kept if answered 200

    def start(self) -> None:
        self._read_on()
        self._wait_for_head(self.server.read_timeout, counted=True)

    # -- the socket ---------------------------------------------------------------------------
    def _read_on(self) -> None:
        if not self.reading and not self.closed:
            self.reading = True
            self.loop.add_reader(self.fd, self._readable)

    def _read_off(self) -> None:
        if self.reading:
            self.reading = False
            self.loop.remove_reader(self.fd)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()  # reset by the client
            return
        if data:
            self._received(data)
        else:
            self._eof()

    def _received(self, data: bytes) -> None:
        self.buffer += data
        if self.busy:
            # Reading goes on while the answer is worked on (what a client sends meanwhile is
            # kept, up to MAX_HEAD_BYTES): stopping and starting cost two epoll_ctl per request.
            if len(self.buffer) > MAX_HEAD_BYTES:  # pipelining past any sane head: stop reading
                self._read_off()
            return
        if not self.reading_head:
            self.reading_head = True
            self._arm(self.server.read_timeout, counted=True)
        self._try_request()

    def _eof(self) -> None:
        """The client finished sending (a half-close): answer what it asked, then close."""
        self.keep_alive_after = False
        self._read_off()  # the end of the stream stays readable: watching it would spin
        if not self.busy and not self._request_waiting():
            self.close()

    def _request_waiting(self) -> bool:
        """A whole request (pipelined) is buffered: it is answered before a half-close closes."""
        return b"\r\n\r\n" in self.buffer

    def _send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.out:
            self.out += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.abort()
            return
        if sent < len(data):
            # The client does not take its answers: no new request is read until it has (see
            # _wait_for_head), so what is kept for it is one answer, not one per request it sends.
            self.out = data[sent:]
            self.loop.add_writer(self.fd, self._writable)
            self._read_off()

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        self.out = self.out[sent:]
        if self.out:
            return
        self.loop.remove_writer(self.fd)
        if self.close_when_sent:
            self.close()
        elif not self.busy:
            self._wait_for_head(IDLE_TIMEOUT, counted=False)  # taken: read its next request

    def close(self) -> None:
        """Close once what is owed is sent (at most read_timeout more: the timer aborts)."""
        if self.out and not self.closed:
            self.close_when_sent = True
            self._read_off()
            self._arm(self.server.read_timeout, counted=False)
            return
        self.abort()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._disarm()
        self._read_off()
        if self.out:
            self.out = b""
            self.loop.remove_writer(self.fd)
        self.sock.close()
        if self._unqueue():  # still waiting for a slot: it never runs
            self.work = None
            self.server.stats.work_admitted -= 1
        self.server.forget(self)

    # -- the request cycle ------------------------------------------------------------------------
    def _wait_for_head(self, timeout: float, counted: bool):
        self.busy = False
        self.reading_head = bool(self.buffer)
        self.client_record.idle[self] = None
        if self.out:  # the client has not read its last answer yet: it gets read_timeout to do so
            self._arm(self.server.read_timeout, counted=False)
            return
        self._arm(self.server.read_timeout if self.buffer else timeout, counted=counted or bool(self.buffer))
        if self.keep_alive_after:
            self._read_on()
        if self.buffer:
            # A pipelined request: taken on the loop's next round, not by recursion (hundreds of
            # tiny requests in one read would otherwise nest a call chain per request).
            self.loop.call_soon(self._next_request)

    def _next_request(self):
        if not self.closed and not self.busy and not self.out and self.buffer:
            self._try_request()

    def _try_request(self):
        try:
            self._take_request()
        except Exception as exc:  # the server's own bug: one line, a 500, this connection closed
            log_failure(self.server.name, "reading a request", exc)
            if not self.closed and not self.busy:
                self._fail(500, "internal error (logged)")

    def _take_request(self):
        try:
            length = head_length(self.buffer)
            if not length:
                return
            head, self.buffer = self.buffer[:length], self.buffer[length:]
            parsed, kept = self.server.parsed(head)
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

    def _submit(self, route: Route, request: Request):
        server, client = self.server, self.client_record
        server.stats.work_admitted += 1
        self.work = (route, request)
        if server.may_start(client) and not client.waiting:
            self.start_work()
            return
        wait = max(0.0, route.start_within(request) - (time.monotonic() - request.received))
        client.waiting[self] = None
        server.waiting[client] = None
        self.shed_timer = self.loop.call_later(wait, self._shed)

    def _unqueue(self) -> bool:
        """Out of the waiting work; True if it was waiting."""
        if self.shed_timer is not None:
            self.shed_timer.cancel()
            self.shed_timer = None
        return self.client_record.waiting.pop(self, 0) is None

    def start_work(self):
        """A slot is free: the work starts, on the loop (``on_loop``) or a worker."""
        self._unqueue()
        server = self.server
        route, request = self.work
        server.free_slots -= 1
        self.client_record.running += 1
        server.stats.work_running += 1
        self.running = True
        if route.on_loop is None:
            self._reply(lambda: route.handler(request))
            return
        try:
            route.on_loop(request, self._reply)
        except Exception as exc:
            log_failure(server.name, f"{request.method} {request.path}", exc)
            self._reply(plain(500, "internal error (logged)\n"))

    def _reply(self, answer):
        """The work's answer: a Response, or a callable to run on a worker for it."""
        if not self.running:
            return
        if isinstance(answer, Response):
            self._work_done(answer)
            return
        server, loop = self.server, self.loop
        job = server.executor.submit(server.run_work, answer, self.work[1])
        job.add_done_callback(lambda done: done.cancelled() or call_soon(loop, self._finished, done))

    def _shed(self):
        """No slot came free within the route's wait: the work never runs; answer overloaded."""
        self.shed_timer = None
        if not self._unqueue() or self.work is None:
            return
        route, request = self.work
        self.work = None
        self.server.stats.work_admitted -= 1
        self.server.stats.shed += 1
        if not self.closed:
            try:
                response = route.overloaded(request)
            except Exception as exc:
                log_failure(self.server.name, "overloaded answer", exc)
                response = plain(503, "overloaded\n")
            self._respond(response)

    def _finished(self, job):
        try:
            response = job.result()
        except Exception as exc:  # run_work answers 500 for a route's errors; this is the server's own
            log_failure(self.server.name, "worker", exc)
            response = plain(500, "internal error (logged)\n")
        self._work_done(response)

    def _work_done(self, response: Response):
        server, client = self.server, self.client_record
        self.running = False
        self.work = None
        server.free_slots += 1
        client.running -= 1
        server.stats.work_running -= 1
        server.stats.work_admitted -= 1
        if not self.closed:
            self._respond(response)
        else:
            server.release(client)
        server.start_waiting()

    def _respond(self, response: Response):
        if self.head is not None:
            if response.status == 200:
                self.server.keep(*self.head)
            self.head = None
        self.keep_alive = self.keep_alive and (self.keep_alive_after or self._request_waiting())
        self._send(encode(response, self.keep_alive, self.with_body))
        if not self.keep_alive:
            self.close()
            return
        self._wait_for_head(IDLE_TIMEOUT, counted=False)

    def _fail(self, status: int, text: str):
        self.server.stats.dropped["bad_request"] += 1
        log.debug("%s: %s from %s", self.server.name, text, self.client)
        self._send(encode(plain(status, text + "\n"), keep_alive=False))
        self.close()

    # -- timers -----------------------------------------------------------------------------------
    def _arm(self, timeout: float, counted: bool):
        self._disarm()
        self.timer = self.loop.call_later(timeout, self._timed_out, counted)

    def _disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, counted: bool):
        self.timer = None
        if counted:
            self.server.stats.dropped["read_timeout"] += 1
        self.abort()


def call_soon(loop: Loop, callback, *args) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop is closed: the server has stopped, nobody waits for this
        pass
