"""HTTP for readings: every byte of every request of one reading arrives before one deadline.

How a request fails is itself the reading (refused: down; accepted but silent: wedged), so it is
classified here, once. Not ``requests``: its timeouts bound each socket read, so a server that
drips its answer holds a reading as long as it likes; here ``http.client`` parses over a socket
that re-arms its timeout before every read with what is left until the ``Deadline``. Redirects
are never followed, so a target's API key only ever goes to that target.
"""
from __future__ import annotations

import http.client
import io
import json as jsonlib
import select
import socket
import ssl
import time
from urllib.parse import urlsplit

from .answer import MAX_ERROR_BODY, MAX_PAGE_BYTES, USER_AGENT, Fetched
from .connect import connect_within, short_error, shown_host, tls_context
from .deadline import Deadline
from .idlepool import IdlePool
from .observation import BROKEN, HTTP_ERROR, OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE

__all__ = ["BROKEN", "HTTP_ERROR", "MAX_ERROR_BODY", "MAX_PAGE_BYTES", "OK", "REFUSED", "TIMEOUT", "TOO_LARGE",
           "UNREACHABLE", "USER_AGENT", "Client", "Deadline", "Fetched", "connect_within", "tls_context"]

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux


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
            # body separately with Nagle on (cpp-httplib's default) would otherwise wait for our
            # delayed ACK before sending the body (bench/RESULTS-exporter.md, "transport").
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

    def usable(self) -> bool:
        """False when an idle connection was closed by the server (or has stray bytes)."""
        if self.sock is None:
            return False
        try:
            readable, _, _ = select.select([self.sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable


class Client:
    """Requests with a deadline, keeping up to ``max_idle`` idle keep-alive connections
    (``IdlePool``). Thread-safe: a connection is used by one request at a time.
    ``headers`` go with every request (the User-Agent; never an API key — that is per target).
    """

    def __init__(self, max_idle: int = 64):
        self.idle: IdlePool[_Connection] = IdlePool(max_idle, usable=_Connection.usable, close=_Connection.close)

    def close(self) -> None:
        self.idle.close()

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
                return failed(UNREACHABLE, f"connection failed: {shown_host(host)} is not a valid host name ({exc})")
            host_header = ascii_host + (f":{parts.port}" if parts.port else "")
            host, origin = ascii_host, (scheme, ascii_host, port)
        sent_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Host": host_header}
        if body is not None:
            sent_headers["Content-Type"] = "application/json"
        sent_headers.update(headers or {})

        for attempt in (0, 1):
            connection = self.idle.take(origin) if attempt == 0 else None
            if connection is None:
                connection = _Connection(scheme, host, port)
            else:
                connection.reused = True
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
                return failed(BROKEN, f"connection closed without an answer: {short_error(exc)}")
            except (OSError, http.client.HTTPException, ssl.SSLError, UnicodeError, ValueError) as exc:
                # (UnicodeError, ValueError: what http.client raises for a request it cannot encode)
                connection.close()
                return failed(UNREACHABLE, f"connection failed: {short_error(exc)}")
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
            return Fetched(BROKEN, http_status=status, error=f"answer broken off: {short_error(exc)}",
                           elapsed=time.monotonic() - started)
        elapsed = time.monotonic() - started
        data = b"".join(chunks)
        if response.isclosed() and not response.will_close and connection.sock is not None:
            self.idle.give_back(origin, connection)
        else:
            response.close()
            connection.close()
        if status >= 300:
            return Fetched(HTTP_ERROR, body=data[:limit], http_status=status, error=f"HTTP {status}",
                           elapsed=elapsed, content_type=content_type)
        return Fetched(OK, body=data, http_status=status, elapsed=elapsed, content_type=content_type)


