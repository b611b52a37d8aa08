"""The exporter's HTTP server: one that holds up under load and hostile peers.

``BoundedHTTPServer`` is what the exporter runs. A thread per connection (the standard
library's server) lets any client hold a thread for as long as it likes by sending its
request slowly, and its listen backlog of 5 drops connections when a Prometheus restart
scrapes a thousand targets at once. Here instead:

- one event loop (``hangwatch.exporter.evloop``: non-blocking sockets on epoll) reads every
  connection, so a half-open or idle connection costs a socket and a few kilobytes, never a
  thread; a request head must arrive within ``read_timeout``
  and fit in ``MAX_HEAD_BYTES``, an idle keep-alive connection is closed after
  ``IDLE_TIMEOUT``;
- at most ``max_connections`` are open: a new one first evicts the oldest connection that is
  not being answered (idle, or still sending its head), else it is refused;
- at most ``workers`` requests that do work (they read a backend) are worked on at once; a
  request that cannot start within the time its route allows is answered 503 at that moment
  (the route says how long: a scrape's answer is useless after Prometheus' timeout). Such a
  route runs on a worker thread, or — ``on_loop`` — starts on the loop itself and either
  answers there (non-blocking I/O: no thread hand-off, which costs more CPU than a busy
  backend's reading) or hands the rest to a worker. Cheap routes (``inline``) are answered on
  the loop at once, so they answer even when every worker waits on a stalled backend.
- HTTP/1.1 keep-alive, so a scraper reuses its connections; GET only, no request bodies.

The server knows nothing about the exporter: it maps paths to ``Route`` objects, and a route
maps a ``Request`` to a ``Response``. It imports nothing outside the standard library.
"""
from __future__ import annotations

import collections
import errno
import logging
import socket
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from types import MappingProxyType
from typing import Callable, Mapping
from urllib.parse import urlsplit

from .evloop import Loop

log = logging.getLogger("hangwatch.exporter.httpserver")

MAX_HEAD_BYTES = 16384      # request line and headers; Prometheus sends ~300 bytes
MAX_HEADERS = 100
IDLE_TIMEOUT = 120.0        # an idle keep-alive connection (Prometheus keeps them 5 min)
LISTEN_BACKLOG = 4096       # the kernel caps it at net.core.somaxconn
ACCEPTS_PER_WAKE = 64
RECV_BYTES = 65536
KEPT_HEADS = 20000          # request heads kept parsed (one per target: the same every scrape)
MAX_KEPT_HEAD = 1024        # longer heads are parsed every time (a client cannot fill memory)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]        # names in lower case
    received: float                   # time.monotonic() when the head was complete
    client: str = ""


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Route:
    """``handler(request) -> Response``. ``inline``: cheap and never blocks (answered on the
    loop). Otherwise it is work: it must start within ``start_within(request)`` seconds of
    arriving or be answered ``overloaded(request)`` instead, and runs on a worker thread — or,
    with ``on_loop(request, reply)``, starts on the loop: it must never block there, and calls
    ``reply`` once (on the loop) with a ``Response``, or with a callable ``() -> Response`` that
    is run on a worker. The work holds its slot until it is answered."""

    handler: Callable[[Request], Response]
    inline: bool = False
    start_within: Callable[[Request], float] = lambda request: 5.0
    overloaded: Callable[[Request], Response] = lambda request: Response(
        503, "text/plain; charset=utf-8", b"overloaded: no worker free in time\n")
    on_loop: Callable[[Request, Callable[[object], None]], None] | None = None


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


def _plain(status: int, text: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", text.encode())


class _BadRequest(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str], bool]:
    """(method, path, query, headers, keep_alive) from a request head without its blank line."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise _BadRequest(400, "bad request") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(400, "bad request line")
    method, target, version = parts
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(431, "too many headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise _BadRequest(400, "malformed header")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers or headers.get("content-length", "0") not in ("0", ""):
        raise _BadRequest(400, "request bodies are not accepted")
    if not target.startswith("/"):
        raise _BadRequest(400, "bad request target")
    url = urlsplit(target)
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return method, url.path, url.query, headers, keep_alive


def encode(response: Response, keep_alive: bool, with_body: bool = True) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Status"
    head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}"]
    head += [f"{name}: {value}" for name, value in response.headers]
    if not keep_alive:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (response.body if with_body else b"")


class BoundedHTTPServer:
    """An HTTP/1.1 server with bounded connections, threads and waits (see the module doc).

    The socketserver-like surface (``server_address``, ``serve_forever``, ``shutdown``,
    ``server_close``): binds in the constructor, so a bad address fails before anything runs.
    """

    def __init__(self, address: tuple[str, int], routes: Mapping[str, Route], *, max_connections: int = 1024,
                 read_timeout: float = 5.0, workers: int = 64, name: str = "hangwatch"):
        self.routes = dict(routes)
        self.max_connections, self.read_timeout, self.workers = max_connections, read_timeout, workers
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
        self.evictable: OrderedDict[_Connection, None] = OrderedDict()  # oldest first
        self.connections: set[_Connection] = set()
        self.free_slots = workers  # work being done now, on the loop or a thread (loop thread only)
        self.waiting: collections.deque = collections.deque()  # (connection, ticket), oldest first
        self.heads: dict[bytes, tuple] = {}  # a request head -> what parse_head made of it (KEPT_HEADS)

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
            connection = _Connection(self, sock, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "")
            if not self.admit(connection):
                sock.close()
                continue
            connection.start()

    def _resume_accepting(self) -> None:
        if self.socket.fileno() != -1 and self._running.is_set():
            self.loop.add_reader(self.socket.fileno(), self._accept)

    # -- bookkeeping the connections use --------------------------------------------------------
    def admit(self, connection: "_Connection") -> bool:
        """Room for one more connection: evict the oldest one nobody is answered on, if need be."""
        if len(self.connections) >= self.max_connections:
            while self.evictable:
                oldest, _ = self.evictable.popitem(last=False)
                if not oldest.closed:
                    self.stats.dropped["evicted"] += 1
                    oldest.abort()
                    break
            else:
                self.stats.dropped["refused"] += 1
                return False
        self.connections.add(connection)
        self.stats.connections_open = len(self.connections)
        return True

    def forget(self, connection: "_Connection") -> None:
        self.connections.discard(connection)
        self.evictable.pop(connection, None)
        self.stats.connections_open = len(self.connections)

    def parsed(self, head: bytes) -> tuple[str, str, str, Mapping[str, str], bool]:
        """``parse_head(head)``, kept for heads seen before: Prometheus sends each target the
        same head every scrape. Only good heads of at most ``MAX_KEPT_HEAD`` bytes are kept, at
        most ``KEPT_HEADS`` of them (the oldest goes first)."""
        known = self.heads.get(head)
        if known is None:
            method, path, query, headers, keep_alive = parse_head(head)
            known = (method, path, query, MappingProxyType(headers), keep_alive)
            if len(head) <= MAX_KEPT_HEAD:
                heads = self.heads
                while len(heads) >= KEPT_HEADS:
                    heads.pop(next(iter(heads)))
                heads[head] = known
        return known

    def answer_inline(self, request: Request) -> Response | Route:
        """The response for a request that needs no worker, or the route that does."""
        if request.method != "GET":
            return Response(405, "text/plain; charset=utf-8", b"only GET\n", (("Allow", "GET"),))
        route = self.routes.get(request.path)
        if route is None:
            return _plain(404, "not found\n")
        if not route.inline:
            return route
        return self.call(route, request)

    def call(self, route: Route, request: Request) -> Response:
        try:
            return route.handler(request)
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return _plain(500, "internal error (logged)\n")

    def run_work(self, work: Callable[[], Response], request: Request) -> Response:
        """On a worker thread."""
        try:
            return work()
        except Exception:
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return _plain(500, "internal error (logged)\n")

    def start_waiting(self) -> None:
        """Give free slots to the oldest waiting work (on the loop)."""
        while self.free_slots > 0 and self.waiting:
            connection, ticket = self.waiting.popleft()
            if connection.ticket is ticket:
                connection.start_work()


class _Connection:
    """One client connection on a non-blocking socket: read a head (within read_timeout),
    answer, repeat (keep-alive). Every method runs on the loop's thread."""

    def __init__(self, server: BoundedHTTPServer, sock: socket.socket, client: str):
        self.server = server
        self.loop = server.loop
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.buffer = b""
        self.busy = False          # a request is being answered: not evictable, not taking a new one
        self.closed = False
        self.timer = None
        self.reading_head = False  # bytes of a head have arrived (read_timeout applies)
        self.reading = False       # the loop watches the socket for bytes
        self.out = b""             # the part of an answer the socket had no room for yet
        self.close_when_sent = False
        self.work: tuple[Route, Request] | None = None  # admitted work not yet answered
        self.ticket: object | None = None   # set while that work waits for a slot
        self.running = False                # that work holds a slot
        self.shed_timer = None
        self.keep_alive = True
        self.keep_alive_after = True   # False once the client has half-closed

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
        if self.ticket is not None:  # still waiting for a slot: it never runs
            self._unqueue()
            self.work = None
            self.server.stats.work_admitted -= 1
        self.server.forget(self)

    # -- the request cycle ------------------------------------------------------------------------
    def _wait_for_head(self, timeout: float, counted: bool):
        self.busy = False
        self.reading_head = bool(self.buffer)
        self.server.evictable[self] = None
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
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self._fail(431, "request head too large")
            return
        if end > MAX_HEAD_BYTES:
            self._fail(431, "request head too large")
            return
        head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
        try:
            method, path, query, headers, keep_alive = self.server.parsed(head)
        except _BadRequest as bad:
            self._fail(bad.status, bad.text)
            return
        self._disarm()
        self.busy, self.reading_head = True, False
        self.server.evictable.pop(self, None)
        self.keep_alive = keep_alive
        request = Request(method, path, query, headers, time.monotonic(), self.client)
        answer = self.server.answer_inline(request)
        if isinstance(answer, Response):
            self._respond(answer)
        else:
            self._submit(answer, request)

    def _submit(self, route: Route, request: Request):
        server = self.server
        server.stats.work_admitted += 1
        self.work = (route, request)
        if server.free_slots > 0 and not server.waiting:
            self.start_work()
            return
        wait = max(0.0, route.start_within(request) - (time.monotonic() - request.received))
        self.ticket = object()
        server.waiting.append((self, self.ticket))
        self.shed_timer = self.loop.call_later(wait, self._shed)

    def _unqueue(self):
        self.ticket = None
        if self.shed_timer is not None:
            self.shed_timer.cancel()
            self.shed_timer = None

    def start_work(self):
        """A slot is free: the work starts, on the loop (``on_loop``) or a worker."""
        self._unqueue()
        server = self.server
        route, request = self.work
        server.free_slots -= 1
        server.stats.work_running += 1
        self.running = True
        if route.on_loop is None:
            self._reply(lambda: route.handler(request))
            return
        try:
            route.on_loop(request, self._reply)
        except Exception:
            log.exception("%s: %s %s failed", server.name, request.method, request.path)
            self._reply(_plain(500, "internal error (logged)\n"))

    def _reply(self, answer):
        """The work's answer: a Response, or a callable to run on a worker for it."""
        if not self.running:
            return
        if isinstance(answer, Response):
            self._work_done(answer)
            return
        server, loop = self.server, self.loop
        job = server.executor.submit(server.run_work, answer, self.work[1])
        job.add_done_callback(lambda done: done.cancelled() or _call_soon(loop, self._finished, done))

    def _shed(self):
        """No slot came free within the route's wait: the work never runs; answer overloaded."""
        self.shed_timer = None
        if self.ticket is None:
            return
        route, request = self.work
        self._unqueue()
        self.work = None
        self.server.stats.work_admitted -= 1
        self.server.stats.shed += 1
        if not self.closed:
            try:
                response = route.overloaded(request)
            except Exception:
                log.exception("%s: overloaded answer failed", self.server.name)
                response = _plain(503, "overloaded\n")
            self._respond(response)

    def _finished(self, job):
        try:
            response = job.result()
        except Exception:  # run_work answers 500 for a route's errors; this is the server's own
            log.exception("%s: worker failed", self.server.name)
            response = _plain(500, "internal error (logged)\n")
        self._work_done(response)

    def _work_done(self, response: Response):
        server = self.server
        self.running = False
        self.work = None
        server.free_slots += 1
        server.stats.work_running -= 1
        server.stats.work_admitted -= 1
        server.start_waiting()
        if not self.closed:
            self._respond(response)

    def _respond(self, response: Response):
        self.keep_alive = self.keep_alive and (self.keep_alive_after or self._request_waiting())
        self._send(encode(response, self.keep_alive))
        if not self.keep_alive:
            self.close()
            return
        self._wait_for_head(IDLE_TIMEOUT, counted=False)

    def _fail(self, status: int, text: str):
        self.server.stats.dropped["bad_request"] += 1
        self._send(encode(_plain(status, text + "\n"), keep_alive=False))
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


def _call_soon(loop: Loop, callback, *args) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop is closed: the server has stopped, nobody waits for this
        pass
