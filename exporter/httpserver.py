"""The exporter's HTTP server: one that holds up under load and hostile peers.

``BoundedHTTPServer`` is what the exporter runs. A thread per connection (the standard
library's server) lets any client hold a thread for as long as it likes by sending its
request slowly, and its listen backlog of 5 drops connections when a Prometheus restart
scrapes a thousand targets at once. Here instead:

- one event loop (``hangwatch.exporter.evloop``: non-blocking sockets on epoll) reads every
  connection, so a half-open or idle connection costs a socket and a few kilobytes, never a
  thread; a request head must arrive within ``read_timeout`` and fit in ``MAX_HEAD_BYTES``, an
  idle keep-alive connection is closed after ``IDLE_TIMEOUT``;
- heads are parsed by llhttp (``httptools``: the parser of Node.js and uvicorn), strict, plus
  the checks it leaves to its caller (``parse_head``); whatever a client sends, it gets an
  answer (400/431/500) or a close, never an exception past its connection;
- no client (peer address) can starve another: at most ``max_connections`` are open, at most
  ``max_client_connections`` from one address; when the table is full, room is made by
  evicting a connection of the address holding the most (an idle one first), and a newcomer
  is refused only when its own address is that one. Each connection has one request in
  flight; what it pipelines behind stays unread bytes (at most ``MAX_HEAD_BYTES``);
- a head its route answered 200 is kept parsed (``KEPT_HEADS_BYTES``), so Prometheus' same
  head every scrape is parsed once; no other head is kept;
- at most ``workers`` requests that do work (they read a backend) are worked on at once, at
  most ``max_client_slots`` of them for one address, and waiting work is started round-robin
  over addresses; a request that cannot start within the time its route allows is answered
  503 at that moment (the route says how long: a scrape's answer is useless after
  Prometheus' timeout). Such a route runs on a worker thread, or — ``on_loop`` — starts on
  the loop itself and either answers there (non-blocking I/O: no thread hand-off, which costs
  more CPU than a busy backend's reading) or hands the rest to a worker. Cheap routes
  (``inline``) are answered on the loop at once, so they answer even when every worker waits
  on a stalled backend;
- HTTP/1.1 keep-alive, so a scraper reuses its connections; GET and HEAD, no request bodies.

The server knows nothing about the exporter: it maps paths to ``Route`` objects, and a route
maps a ``Request`` to a ``Response``. It imports nothing outside the standard library but
httptools.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple

import httptools

from .evloop import Loop

log = logging.getLogger("hangwatch.exporter.httpserver")

MAX_HEAD_BYTES = 16384      # request line and headers; Prometheus sends ~300 bytes
MAX_HEADERS = 100
IDLE_TIMEOUT = 120.0        # an idle keep-alive connection (Prometheus keeps them 5 min)
LISTEN_BACKLOG = 4096       # the kernel caps it at net.core.somaxconn
ACCEPTS_PER_WAKE = 64
RECV_BYTES = 65536
# Heads answered 200 are kept parsed (Prometheus sends each target the same head every scrape):
# only heads of at most MAX_KEPT_HEAD bytes, KEPT_HEADS_BYTES of them in all (oldest out first).
# A head on an unknown path, or with a query its route refused, is never kept.
MAX_KEPT_HEAD = 1024
KEPT_HEADS_BYTES = 4 * 1024 * 1024
KEPT_HEAD_OVERHEAD = 1024   # what a kept head costs beside its bytes (its Head, dict, strings)
ALLOWED_METHODS = ("GET", "HEAD")


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


class Head(NamedTuple):
    """What a request head says, once llhttp has accepted it and the checks below have passed."""

    method: str
    path: str
    query: str
    headers: dict[str, str]   # names in lower case, values without surrounding blanks (the last wins)
    keep_alive: bool


class _HeadReader:
    """llhttp's callbacks for one head (a fresh parser per head: none of its state outlives it)."""

    __slots__ = ("url", "headers", "hosts", "count", "complete")

    def __init__(self):
        self.url, self.headers, self.hosts, self.count, self.complete = b"", {}, 0, 0, False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        if self.count > MAX_HEADERS:
            raise _BadRequest(431, "too many headers")
        key = name.decode("latin-1").lower()
        if key == "host":
            self.hosts += 1
        self.headers[key] = value.decode("latin-1").strip(" \t")

    def on_message_complete(self) -> None:
        self.complete = True


def head_length(buffer: bytes) -> int:
    """The length of the request head that starts ``buffer`` (its blank line included), or 0
    while it is not whole yet. A head too large, or one with a line ended by LF alone (which a
    CRLF blank line would then never end), is refused at once instead of at read_timeout."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise _BadRequest(431, "request head too large")
        if b"\n\n" in buffer or b"\n\r\n" in buffer:
            raise _BadRequest(400, "bad request: lines must end with CRLF")
        return 0
    if end + 4 > MAX_HEAD_BYTES:
        raise _BadRequest(431, "request head too large")
    return end + 4


def parse_head(head: bytes) -> Head:
    """A request head, up to and including its blank line, as llhttp (strict) reads it, plus what
    llhttp leaves to its caller: only HTTP/1.0 and 1.1, one SP between the request line's parts,
    exactly one Host on 1.1 (at most one on 1.0), and no body (GET and HEAD carry none)."""
    reader = _HeadReader()
    parser = httptools.HttpRequestParser(reader)
    upgrade = False
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        upgrade = True  # Upgrade: or CONNECT: answered as any other, then closed (what follows is not HTTP)
    except httptools.HttpParserCallbackError as exc:
        cause = exc.__context__
        raise cause if isinstance(cause, _BadRequest) else _BadRequest(400, "bad request") from None
    except httptools.HttpParserError as exc:
        raise _BadRequest(400, f"bad request: {exc}") from None
    headers = reader.headers
    if not reader.complete or "transfer-encoding" in headers or headers.get("content-length", "0").lstrip("0"):
        raise _BadRequest(400, "request bodies are not accepted")  # (llhttp stops at CONNECT's head)
    if not reader.url:  # llhttp lets CONNECT through without one
        raise _BadRequest(400, "bad request target")
    start = 0
    while head.startswith(b"\r\n", start):  # empty lines before a request line are allowed
        start += 2
    if head[start:start + 1] in (b"\r", b"\n"):  # an empty line ended by LF alone (llhttp skips it)
        raise _BadRequest(400, "bad request: lines must end with CRLF")
    line_end = head.find(b"\r\n", start)
    if head.count(b" ", start, line_end) != 2:  # llhttp lets "GET  /" through; the grammar has one SP
        raise _BadRequest(400, "bad request line")
    version = head[line_end - 9:line_end]
    if version[6:] != parser.get_http_version().encode():  # "GET HTTP/1.0": llhttp reads 0.9, that URL
        raise _BadRequest(400, "bad request line")
    if version == b" HTTP/1.1":
        if reader.hosts != 1:
            raise _BadRequest(400, "HTTP/1.1 needs exactly one Host header")
        keep_alive = not upgrade and "close" not in headers.get("connection", "").lower()
    elif version == b" HTTP/1.0":
        if reader.hosts > 1:
            raise _BadRequest(400, "more than one Host header")
        keep_alive = not upgrade and "keep-alive" in headers.get("connection", "").lower()
    else:
        raise _BadRequest(400, "only HTTP/1.0 and HTTP/1.1")
    path, query = split_target(reader.url.decode("latin-1"))
    return Head(parser.get_method().decode("latin-1"), path, query, headers, keep_alive)


def split_target(target: str) -> tuple[str, str]:
    """(path, query) of an origin-form (``/p?q``) or absolute-form (``http://h/p?q``) target;
    any other form comes back as a path no route has (answered 404). Never raises."""
    if not target.startswith("/"):
        scheme, sep, rest = target.partition("://")
        if sep and scheme.lower() in ("http", "https"):
            cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
            target = rest[cut:]
            if not target.startswith("/"):
                target = "/" + target
    target = target.partition("#")[0]
    path, _, query = target.partition("?")
    return path, query


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


def _log_failure(name: str, what: str, exc: BaseException) -> None:
    """One line per failed request (the traceback only at debug level): a client that can make a
    request fail must not be able to fill the log with tracebacks."""
    log.error("%s: %s failed: %s: %s", name, what, type(exc).__name__, exc,
              exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)


def client_connection_cap(max_connections: int) -> int:
    """One address may hold all but a sixty-fourth of the table: room for others to connect
    without evicting, while one Prometheus' burst of 1,000 scrapes fits a table of 1,024."""
    return max(1, max_connections - max(1, max_connections // 64))


def client_slot_cap(workers: int) -> int:
    """One address may hold all but an eighth of the work slots (a kubelet's /livez finds one
    free while another client keeps the rest busy); with fewer than 8, round-robin alone."""
    return max(1, workers - workers // 8)


class _Client:
    """One peer address: its connections (oldest first), the idle ones among them (evictable,
    oldest first), the work slots it holds and its work waiting for one (oldest first)."""

    __slots__ = ("address", "connections", "idle", "running", "waiting")

    def __init__(self, address: str):
        self.address = address
        self.connections: dict[_Connection, None] = {}
        self.idle: OrderedDict[_Connection, None] = OrderedDict()
        self.running = 0
        self.waiting: OrderedDict[_Connection, None] = OrderedDict()


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
        self.connections: set[_Connection] = set()
        self.clients: dict[str, _Client] = {}
        self.free_slots = workers  # work being done now, on the loop or a thread (loop thread only)
        self.waiting: OrderedDict[_Client, None] = OrderedDict()  # clients with waiting work, round-robin
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
                client = self.clients[address] = _Client(address)
            connection = _Connection(self, sock, client, f"{address}:{peer[1]}" if isinstance(peer, tuple) else "")
            if not self.admit(connection):
                sock.close()
                self._release(client)
                continue
            connection.start()

    def _resume_accepting(self) -> None:
        if self.socket.fileno() != -1 and self._running.is_set():
            self.loop.add_reader(self.socket.fileno(), self._accept)

    # -- bookkeeping the connections use --------------------------------------------------------
    def admit(self, connection: "_Connection") -> bool:
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

    def _evict_from(self, client: _Client, busy_too: bool) -> bool:
        """Close the client's oldest idle connection, else (``busy_too``) its oldest one."""
        victim = next(iter(client.idle), None)
        if victim is None and busy_too:
            victim = next(iter(client.connections), None)
        if victim is None:
            return False
        self.stats.dropped["evicted"] += 1
        victim.abort()
        return True

    def forget(self, connection: "_Connection") -> None:
        client = connection.client_record
        self.connections.discard(connection)
        client.connections.pop(connection, None)
        client.idle.pop(connection, None)
        self.stats.connections_open = len(self.connections)
        self._release(client)

    def _release(self, client: _Client) -> None:
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
            return _plain(404, "not found\n")
        if not route.inline:
            return route
        return self.call(route, request)

    def call(self, route: Route, request: Request) -> Response:
        try:
            return route.handler(request)
        except Exception as exc:
            _log_failure(self.name, f"{request.method} {request.path}", exc)
            return _plain(500, "internal error (logged)\n")

    def run_work(self, work: Callable[[], Response], request: Request) -> Response:
        """On a worker thread."""
        try:
            return work()
        except Exception as exc:
            _log_failure(self.name, f"{request.method} {request.path}", exc)
            return _plain(500, "internal error (logged)\n")

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

    def may_start(self, client: _Client) -> bool:
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
                        _log_failure(self.name, "starting work", exc)
                        connection.abort()
                if not started:
                    break
        finally:
            self._starting = False


class _Connection:
    """One client connection on a non-blocking socket: read a head (within read_timeout),
    answer, repeat (keep-alive). Every method runs on the loop's thread."""

    def __init__(self, server: BoundedHTTPServer, sock: socket.socket, client: _Client, name: str):
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
            _log_failure(self.server.name, "reading a request", exc)
            if not self.closed and not self.busy:
                self._fail(500, "internal error (logged)")

    def _take_request(self):
        try:
            length = head_length(self.buffer)
            if not length:
                return
            head, self.buffer = self.buffer[:length], self.buffer[length:]
            parsed, kept = self.server.parsed(head)
        except _BadRequest as bad:
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
            _log_failure(server.name, f"{request.method} {request.path}", exc)
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
                _log_failure(self.server.name, "overloaded answer", exc)
                response = _plain(503, "overloaded\n")
            self._respond(response)

    def _finished(self, job):
        try:
            response = job.result()
        except Exception as exc:  # run_work answers 500 for a route's errors; this is the server's own
            _log_failure(self.server.name, "worker", exc)
            response = _plain(500, "internal error (logged)\n")
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
            server._release(client)
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
