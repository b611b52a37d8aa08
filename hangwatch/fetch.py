"""HTTP for readings: every byte of every request of one reading arrives before one deadline.

How a request fails is itself the reading: refused means the port is closed (down, perhaps
loading weights); accepted-but-silent means the process is wedged (hung if it repeats). So the
failure is classified here, once, for every caller.

Why not ``requests``: its timeouts bound each socket read, not the request. A server that
drips its headers or body a byte at a time held one 2.5 s reading for 50-60 s (measured), so
``/probe`` overran Prometheus' scrape timeout and the webhook's re-check its bound. Here
``http.client`` parses, and the socket under it re-arms its timeout before every read and
write with what is left until the reading's ``Deadline``: nothing the other side does can
hold a reading past it. Redirects are never followed, so a target's API key is only ever
sent to that target. Idle keep-alive connections are kept per origin and reused (the
exporter reads the same backends every scrape); one that the server closed is never used.

The deadline covers the connection too: a host name is resolved on a resolver thread that
the reading waits for only as long as its budget allows (``getaddrinfo`` has no timeout of
its own; a resolver that hangs once held a reading for as long as it liked), and each
address is then tried with what is left, not a fresh timeout each. A host name that is no
valid name (a label over 63 characters, ``a..b``) is a failed reading, not an exception. TLS
uses one context per process (``tls_context``), built once: building one reads the system's
CA store, too much work to repeat for every new connection.
"""
from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import json as jsonlib
import queue
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_PAGE_BYTES = 8 * 1024 * 1024  # a real vLLM page is ~55 KB
MAX_ERROR_BODY = 2048
USER_AGENT = "hangwatch"

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux
RESOLVER_THREADS = 16  # host names resolved at once; more wait in line (within their own budgets)

# Why a fetch produced no page.
OK, REFUSED, UNREACHABLE, TIMEOUT, HTTP_ERROR, TOO_LARGE, BROKEN = (
    "ok", "refused", "unreachable", "timeout", "http_error", "too_large", "broken")


class Deadline:
    """One wall-clock moment (``time.monotonic``) by which a whole reading must be done."""

    __slots__ = ("at",)

    def __init__(self, at: float):
        self.at = at

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.at - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.left() <= 0

    def __repr__(self) -> str:
        return f"Deadline(left={self.left():.3f}s)"


@dataclass(frozen=True)
class Fetched:
    status: str
    body: bytes = b""
    http_status: int | None = None
    error: str = ""
    elapsed: float = 0.0
    content_type: str = ""

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class _DeadlineSocket:
    """A socket whose every read and write may only use what is left until the deadline."""

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self._sock = sock
        self.deadline = deadline
        self._io_refs = 0      # as socket.socket: a response may outlive its connection's close()
        self._closed = False

    def _arm(self) -> None:
        left = self.deadline.left()
        if left <= 0:
            raise TimeoutError("the reading's deadline passed")
        self._sock.settimeout(left)

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        if _QUICKACK is not None:
            # Acknowledge at once: on a reused connection a server that writes its headers and
            # body separately with Nagle on (cpp-httplib's default) would otherwise wait ~40 ms
            # for our delayed ACK before sending the body (measured: 45 ms per reading).
            self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return self._sock.recv_into(buffer, nbytes, flags)

    def recv(self, size: int, flags: int = 0) -> bytes:
        self._arm()
        return self._sock.recv(size, flags)

    def sendall(self, data, flags: int = 0) -> None:
        self._arm()
        self._sock.sendall(data, flags)

    def makefile(self, mode: str = "rb", buffering: int | None = None, **_):
        self._io_refs += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"), io.DEFAULT_BUFFER_SIZE)

    def _decref_socketios(self) -> None:  # socket.SocketIO.close() calls this
        self._io_refs = max(0, self._io_refs - 1)
        if self._closed and self._io_refs == 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._io_refs == 0:
            self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def setsockopt(self, *args) -> None:
        self._sock.setsockopt(*args)


class HostNameError(OSError):
    """The host could not be resolved in time, or is no valid host name: the reading fails."""


class _Lookup:
    __slots__ = ("host", "port", "done", "addresses", "error", "abandoned")

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.done = threading.Event()
        self.addresses: list | None = None
        self.error: BaseException | None = None
        self.abandoned = False


class _Resolver:
    """``getaddrinfo`` on a few daemon threads, each lookup awaited only until its deadline.

    ``getaddrinfo`` cannot be interrupted; a reading that stops waiting leaves its lookup to
    finish (or hang) on its thread. At most ``RESOLVER_THREADS`` can hang at once; later lookups
    wait in line and fail at their own deadlines. A lookup whose reader gave up is skipped."""

    def __init__(self, threads: int = RESOLVER_THREADS):
        self._threads, self._started = threads, 0
        self._queue: queue.SimpleQueue[_Lookup] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def resolve(self, host: str, port: int, deadline: Deadline) -> list:
        lookup = _Lookup(host, port)
        self._start_a_thread()
        self._queue.put(lookup)
        if not lookup.done.wait(max(0.0, deadline.left())):
            lookup.abandoned = True
            raise HostNameError(f"resolving {_shown(host)} did not finish within the budget")
        if lookup.error is not None:
            raise lookup.error
        return lookup.addresses

    def _start_a_thread(self) -> None:
        if self._started >= self._threads:
            return
        with self._lock:
            if self._started < self._threads:
                self._started += 1
                threading.Thread(target=self._work, name="hangwatch-resolver", daemon=True).start()

    def _work(self) -> None:
        while True:
            lookup = self._queue.get()
            if lookup.abandoned:
                continue
            try:
                lookup.addresses = socket.getaddrinfo(lookup.host, lookup.port, 0, socket.SOCK_STREAM)
            except UnicodeError as exc:  # IDNA: a label over 63 characters, an empty label (a..b)
                lookup.error = HostNameError(f"{_shown(lookup.host)} is not a valid host name ({exc})")
            except OSError as exc:
                lookup.error = HostNameError(f"cannot resolve {_shown(lookup.host)}: {_short(exc)}")
            except Exception as exc:  # noqa: BLE001 - any failure is this reading's, never the thread's end
                lookup.error = HostNameError(f"cannot resolve {_shown(lookup.host)}: {_short(exc)}")
            lookup.done.set()


_RESOLVER = _Resolver()


def connect_within(host: str, port: int, deadline: Deadline) -> socket.socket:
    """A connected TCP socket to ``host:port``: resolution and every address's connect inside
    ``deadline`` (an address literal needs no lookup)."""
    try:
        ipaddress.ip_address(host)
        addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except ValueError:
        addresses = _RESOLVER.resolve(host, port, deadline)
    error: OSError | None = None
    for family, kind, proto, _, address in addresses:
        left = deadline.left()
        if left <= 0:
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    if error is not None and not isinstance(error, TimeoutError):
        raise error
    raise TimeoutError("the reading's deadline passed while connecting")


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The one TLS configuration readings use (the system's CA store, host names checked),
    built once and shared: an ``SSLContext`` is safe to use from every thread."""
    return ssl.create_default_context()


def _shown(host: str) -> str:
    return repr(host if len(host) <= 80 else host[:77] + "...")


class _Connection(http.client.HTTPConnection):
    """``http.client`` over a ``_DeadlineSocket``; ``deadline`` is re-pointed for each request."""

    def __init__(self, scheme: str, host: str, port: int):
        super().__init__(host, port)
        self.scheme = scheme
        self.deadline = Deadline.after(0)
        self.reused = False

    def connect(self) -> None:
        left = self.deadline.left()
        if left <= 0:
            raise TimeoutError("the reading's deadline passed before connecting")
        raw = connect_within(self.host, self.port, self.deadline)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                raw.settimeout(max(0.001, self.deadline.left()))
                raw = tls_context().wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        self.sock = _DeadlineSocket(raw, self.deadline)

    def point_at(self, deadline: Deadline) -> None:
        self.deadline = deadline
        if isinstance(self.sock, _DeadlineSocket):
            self.sock.deadline = deadline

    def dropped(self) -> bool:
        """True when an idle connection was closed by the server (or has stray bytes)."""
        if self.sock is None:
            return True
        try:
            readable, _, _ = select.select([self.sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class Client:
    """Requests with a deadline, keeping up to ``max_idle`` idle keep-alive connections (LRU).

    Thread-safe: a connection is used by one request at a time; idle ones are shared.
    ``headers`` go with every request (the User-Agent; never an API key — that is per target).
    """

    def __init__(self, max_idle: int = 64):
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[str, str, int], list[_Connection]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._count = self._idle, OrderedDict(), 0
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        with self._lock:
            connections = self._idle.get(origin)
            while connections:
                connection = connections.pop()
                self._count -= 1
                if not connections:
                    del self._idle[origin]
                if not connection.dropped():
                    connection.reused = True
                    return connection
                connection.close()
                connections = self._idle.get(origin)
        return None

    def _give_back(self, origin: tuple[str, str, int], connection: _Connection) -> None:
        if self.max_idle <= 0:
            connection.close()
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
            connection.close()

    def request(self, method: str, url: str, *, deadline: Deadline, max_bytes: int = MAX_PAGE_BYTES,
                json: dict | None = None, headers: dict[str, str] | None = None) -> Fetched:
        """One HTTP request whose whole answer must arrive before ``deadline``."""
        started = time.monotonic()
        budget = max(0.0, deadline.left())
        parts = urlsplit(url)
        scheme = parts.scheme
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        origin = (scheme, host, port)
        body = None if json is None else jsonlib.dumps(json).encode()
        host_header = parts.netloc.rpartition("@")[2]

        def failed(status: str, error: str, http_status: int | None = None) -> Fetched:
            return Fetched(status, http_status=http_status, error=error, elapsed=time.monotonic() - started)

        if not host_header.isascii():  # an internationalized name goes out as its IDNA (xn--) form
            try:
                ascii_host = host.encode("idna").decode("ascii")
            except UnicodeError as exc:
                return failed(UNREACHABLE, f"connection failed: {_shown(host)} is not a valid host name ({exc})")
            host_header = ascii_host + (f":{parts.port}" if parts.port else "")
            host, origin = ascii_host, (scheme, ascii_host, port)
        sent_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Host": host_header}
        if body is not None:
            sent_headers["Content-Type"] = "application/json"
        sent_headers.update(headers or {})

        for attempt in (0, 1):
            connection = self._take(origin) if attempt == 0 else None
            if connection is None:
                connection = _Connection(scheme, host, port)
            connection.point_at(deadline)
            reused = connection.reused
            if deadline.expired:
                connection.close()
                return failed(TIMEOUT, f"no time left in the {budget:g}s budget")
            try:
                connection.request(method, path, body=body, headers=sent_headers)
                response = connection.getresponse()
            except ConnectionRefusedError:
                connection.close()
                return failed(REFUSED, "connection refused")
            except (TimeoutError, socket.timeout):
                connected = connection.sock is not None
                connection.close()
                if not connected:
                    return failed(UNREACHABLE, f"connect to {host}:{port} timed out after {budget:g}s")
                return failed(TIMEOUT, f"connection accepted, no answer within {budget:g}s")
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                connection.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: once more, fresh
                return failed(BROKEN, f"connection closed without an answer: {_short(exc)}")
            except (OSError, http.client.HTTPException, ssl.SSLError, UnicodeError, ValueError) as exc:
                # (UnicodeError, ValueError: what http.client raises for a request it cannot encode)
                connection.close()
                return failed(UNREACHABLE, f"connection failed: {_short(exc)}")
            return self._read(response, connection, origin, started, budget, max_bytes)
        raise AssertionError("unreachable")

    def _read(self, response: http.client.HTTPResponse, connection: _Connection, origin, started: float,
              budget: float, max_bytes: int) -> Fetched:
        status = response.status
        content_type = response.getheader("Content-Type", "")
        limit = max_bytes if status < 300 else MAX_ERROR_BODY
        chunks, size = [], 0
        try:
            while True:
                chunk = response.read(65536)  # closes the response at its end: the connection can be reused
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    response.close()
                    connection.close()
                    if status < 300:
                        return Fetched(TOO_LARGE, http_status=status, error=f"answer exceeds {max_bytes} bytes",
                                       elapsed=time.monotonic() - started)
                    chunks.append(chunk)
                    break
                chunks.append(chunk)
        except (TimeoutError, socket.timeout):
            response.close()
            connection.close()
            return Fetched(TIMEOUT, http_status=status, error=f"answer not complete within {budget:g}s",
                           elapsed=time.monotonic() - started)
        except (OSError, http.client.HTTPException) as exc:
            response.close()
            connection.close()
            return Fetched(BROKEN, http_status=status, error=f"answer broken off: {_short(exc)}",
                           elapsed=time.monotonic() - started)
        elapsed = time.monotonic() - started
        data = b"".join(chunks)
        if response.isclosed() and not response.will_close and connection.sock is not None:
            self._give_back(origin, connection)
        else:
            response.close()
            connection.close()
        if status >= 300:
            return Fetched(HTTP_ERROR, body=data[:limit], http_status=status, error=f"HTTP {status}",
                           elapsed=elapsed, content_type=content_type)
        return Fetched(OK, body=data, http_status=status, elapsed=elapsed, content_type=content_type)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
