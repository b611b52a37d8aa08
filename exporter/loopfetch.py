"""One GET on an asyncio loop, with no thread: the exporter's busy-backend read.

Why: a busy backend's scrape is one GET of its /metrics. Done by ``fetch.Client`` on a worker
thread it cost about five thread wake-ups (request in, hand-off, the backend's answer,
hand-back, reply), each ~100 µs of CPU on a shared VM: more than the reading itself. Here
the loop that read the scrape request connects, sends, and is called back when bytes
arrive, so the answer costs the wake-ups of its own bytes and nothing else.

Same rules as ``fetch`` (whose ``Fetched`` and statuses it returns): one wall-clock
``Deadline`` for the whole request — a single timer at that moment closes the socket, so a
server that drips bytes cannot hold a reading past it; refused / unreachable / accepted but
silent / broken are told apart the same way; the response is framed as ``http.client``
frames it (Content-Length, chunked, read-to-close; HTTP/1.0 keep-alive rules; at most 100
header lines; every status, header, chunk-size and trailer line at most 64 KiB, so a line
that never ends is a broken answer, not a buffer that grows) and the body limit is checked at the same points (every
64 KiB and at the end); an idle keep-alive connection is reused, once retried fresh if
the server had closed it; redirects are never followed.

Only plain ``http://`` to an IP address: a host name needs a blocking resolver and TLS a
handshake, so those targets are read by ``fetch.Client`` on a worker thread, as before
(``can_get``). Every call and callback runs on the loop's own thread.
"""
from __future__ import annotations

import errno
import functools
import ipaddress
import os
import re
import socket
import time
from collections import OrderedDict
from typing import Callable
from urllib.parse import urlsplit

from hangwatch.fetch import (
    BROKEN,
    HTTP_ERROR,
    MAX_ERROR_BODY,
    MAX_PAGE_BYTES,
    OK,
    REFUSED,
    TIMEOUT,
    TOO_LARGE,
    UNREACHABLE,
    USER_AGENT,
    Deadline,
    Fetched,
)

MAX_LINE = 65536       # http.client's _MAXLINE
MAX_HEADER_LINES = 100  # http.client's _MAXHEADERS (the blank line counts)
READ_SIZE = 65536       # fetch.Client reads the body in these steps; the limit is checked at each
RECV = 262144
KEPT_REQUESTS = 20000   # encoded requests kept (one per target URL and API key)

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)

Done = Callable[[Fetched], None]
_HEADER = re.compile(r"[\041-\071\073-\176]*:")  # email.feedparser's header line (a name, then ':')


def _ip_origin(url: str) -> tuple[str, int, int, str, str] | None:
    """(host, port, family, path, Host header) for ``http://IP[:port]/path``, else None.
    Kept per URL (at most 20,000 of at most 512 characters): the same URLs come every scrape."""
    return _kept_origin(url) if len(url) <= 512 else _origin(url)


@functools.lru_cache(maxsize=20000)
def _kept_origin(url: str):
    return _origin(url)


def _origin(url: str):
    try:
        parts = urlsplit(url)
        port = parts.port or 80
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or parts.username is not None:
        return None
    try:
        address = ipaddress.ip_address(parts.hostname)
    except ValueError:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, family, path, parts.netloc


class LoopClient:
    """GETs on one running loop, each whole before its ``Deadline``; up to ``max_idle`` idle
    keep-alive connections (LRU). Not thread-safe: the loop's thread only."""

    def __init__(self, loop, max_idle: int = 256):
        self.loop = loop
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[str, int], list[socket.socket]] = OrderedDict()
        self._count = 0
        # Every read lands here first (one thread: the loop's): a fresh 256 KiB bytes object per
        # recv() was an mmap, ~14 page faults and a munmap per reading (measured with strace/perf).
        self.landing = memoryview(bytearray(RECV))
        self._requests: dict[tuple, bytes] = {}  # (url, headers) -> the request's bytes (KEPT_REQUESTS)

    @staticmethod
    def can_get(url: str) -> bool:
        return _ip_origin(url) is not None

    def get(self, url: str, deadline: Deadline, done: Done, *, headers: dict[str, str] | None = None,
            max_bytes: int = MAX_PAGE_BYTES) -> None:
        """Start ``GET url``; ``done(Fetched)`` is called once, on the loop, by ``deadline`` at the latest."""
        origin = _ip_origin(url)
        if origin is None:
            raise ValueError("LoopClient reads http://IP[:port] only (see can_get)")
        host, port, family, path, netloc = origin
        key = (url, tuple(headers.items()) if headers else ())
        request = self._requests.get(key)
        if request is None:
            request = _request_bytes(path, netloc, headers)
            if len(url) <= 512:  # the same URLs come every scrape; a client cannot fill memory
                while len(self._requests) >= KEPT_REQUESTS:
                    self._requests.pop(next(iter(self._requests)))
                self._requests[key] = request
        _Get(self, host, port, family, request, deadline, done, max_bytes).start()

    def close(self) -> None:
        idle, self._idle, self._count = self._idle, OrderedDict(), 0
        for socks in idle.values():
            for sock in socks:
                sock.close()

    # -- idle connections ---------------------------------------------------------------------
    def take(self, origin: tuple[str, int]) -> socket.socket | None:
        socks = self._idle.get(origin)
        while socks:
            sock = socks.pop()
            self._count -= 1
            if not socks:
                del self._idle[origin]
            if _alive(sock):
                return sock
            sock.close()
            socks = self._idle.get(origin)
        return None

    def give_back(self, origin: tuple[str, int], sock: socket.socket) -> None:
        if self.max_idle <= 0:
            sock.close()
            return
        self._idle.setdefault(origin, []).append(sock)
        self._idle.move_to_end(origin)
        self._count += 1
        while self._count > self.max_idle:
            oldest_origin, oldest = next(iter(self._idle.items()))
            oldest.pop(0).close()
            self._count -= 1
            if not oldest:
                del self._idle[oldest_origin]


def _request_bytes(path: str, netloc: str, headers: dict[str, str] | None) -> bytes:
    sent = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Host": netloc.rpartition("@")[2]}
    sent.update(headers or {})
    return (f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in sent.items()) + "\r\n").encode("latin-1")


def _alive(sock: socket.socket) -> bool:
    """An idle connection the server has not closed and that holds no stray bytes."""
    try:
        return not sock.recv(1, socket.MSG_PEEK)  # b"": closed; bytes: stray, unusable
    except BlockingIOError:
        return True
    except OSError:
        return False


class _BadAnswer(Exception):
    """What ``http.client`` raises as an HTTPException: the answer cannot be framed."""


class _Get:
    """One request's state: connect -> send -> head -> body; one timer at the deadline."""

    CONNECTING, SENDING, HEAD, BODY = "connecting", "sending", "head", "body"

    def __init__(self, client: LoopClient, host, port, family, request: bytes, deadline: Deadline, done: Done,
                 max_bytes: int):
        self.client, self.loop = client, client.loop
        self.host, self.port, self.family, self.request = host, port, family, request
        self.deadline, self.done, self.max_bytes = deadline, done, max_bytes
        self.started = time.monotonic()
        self.budget = max(0.0, deadline.left())
        self.sock: socket.socket | None = None
        self.timer = None
        self.finished = False
        self.reused = False
        self.retried = False
        self.state = self.CONNECTING
        self.watching = None  # "r" or "w": the fd the loop watches for us

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self.deadline.left() <= 0:
            self._fail(TIMEOUT, f"no time left in the {self.budget:g}s budget")
            return
        self.timer = self.loop.call_at(self.deadline.at, self._timed_out)
        self._begin(self.client.take((self.host, self.port)))

    def _begin(self, sock: socket.socket | None) -> None:
        self.buffer = bytearray()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.header_lines = 0
        self.headers_ended = False
        self.version = 11
        self.reused = sock is not None
        self.sent = 0
        if sock is not None:
            self.sock = sock
            self.state = self.SENDING
            self._send()
            return
        self.state = self.CONNECTING
        try:
            sock = socket.socket(self.family, socket.SOCK_STREAM)
        except OSError as exc:
            self._fail(UNREACHABLE, f"connection failed: {_short(exc)}")
            return
        self.sock = sock
        sock.setblocking(False)
        # No TCP_NODELAY (one syscall per reading saved): the request goes out in one send() on a
        # fresh connection, or on an idle one whose last bytes were answered, so Nagle never holds it.
        code = sock.connect_ex((self.host, self.port))
        if code in (0, errno.EINPROGRESS, errno.EAGAIN):
            # Send at once: on loopback the handshake is done within connect(), so this saves a
            # round through the loop; a connection still being made answers EAGAIN, and the
            # send is retried when it is writable (connected, or failed: told by send's error).
            self._send()
        else:
            self._connect_failed(code)

    def _connect_failed(self, code: int) -> None:
        if code == errno.ECONNREFUSED:
            self._fail(REFUSED, "connection refused")
        else:
            self._fail(UNREACHABLE, f"connection failed: {_short(OSError(code, _strerror(code)))}")

    def _send(self) -> None:
        """Send the request (in CONNECTING until a byte is taken: that is the connection made)."""
        try:
            while self.sent < len(self.request):
                self.sent += self.sock.send(self.request[self.sent:])
                if self.state == self.CONNECTING:
                    self.state = self.SENDING
        except BlockingIOError:
            if self.watching is None:
                self._watch("w", self._send)
            return
        except ConnectionRefusedError as exc:
            if self.state == self.CONNECTING:
                self._connect_failed(errno.ECONNREFUSED)
            else:
                self._lost(exc)
            return
        except (BrokenPipeError, ConnectionResetError) as exc:
            if self.state == self.CONNECTING:
                self._fail(UNREACHABLE, f"connection failed: {_short(exc)}")
            else:
                self._lost(exc)
            return
        except OSError as exc:
            self._fail(UNREACHABLE, f"connection failed: {_short(exc)}")
            return
        self.state = self.HEAD
        self._watch("r", self._readable)

    def _readable(self) -> None:
        try:
            if _QUICKACK is not None:
                self.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # as fetch: no delayed ACK
            landing = self.client.landing
            data = landing[:self.sock.recv_into(landing)]  # copied out before this callback returns
        except BlockingIOError:
            return
        except ConnectionResetError as exc:
            self._lost(exc)
            return
        except OSError as exc:
            self._lost(exc)
            return
        try:
            if self.state == self.HEAD:
                self._head(data)
            else:
                self._body(data)
        except _BadAnswer as exc:
            if self.state == self.HEAD:
                self._fail(UNREACHABLE, f"connection failed: {_short(exc)}")
            else:
                self._fail(BROKEN, f"answer broken off: {_short(exc)}", self.status)

    def _lost(self, exc: BaseException) -> None:
        """The connection broke (reset, pipe) or closed before the answer's head was read."""
        if self.state == self.BODY:
            self._fail(BROKEN, f"answer broken off: {_short(exc)}", self.status)
            return
        if self.state == self.HEAD and not isinstance(exc, (ConnectionResetError, BrokenPipeError,
                                                             _RemoteDisconnected)):
            self._fail(UNREACHABLE, f"connection failed: {_short(exc)}")
            return
        if self.reused and not self.retried:  # the server closed an idle keep-alive connection
            self.retried = True
            self._drop_socket()
            self._begin(None)
            return
        self._fail(BROKEN, f"connection closed without an answer: {_short(exc)}")

    # -- the answer -------------------------------------------------------------------------------
    def _head(self, data) -> None:
        """The status line and headers, line by line from a read position: the rest of the
        buffer is never copied per line (a 55 KB page used to be copied once per header line). A
        read that starts an answer is read where it landed (``data`` is the start of
        ``LoopClient.landing``): the page is copied once, into the body, not first into a buffer."""
        eof = not data
        if self.buffer or not isinstance(data, memoryview):
            buffer = self.buffer
            buffer += data
            limit = len(buffer)
        else:
            buffer, limit = data.obj, len(data)  # the landing's bytes; ``data`` is its first ``limit``
        pos = 0
        while True:
            end = buffer.find(b"\n", pos, limit)
            if end == -1:
                if limit - pos > MAX_LINE:
                    raise _BadAnswer("got more than 65536 bytes when reading "
                                     + ("status line" if self.status is None else "header line"))
                if not eof:
                    self.buffer = bytearray(buffer[pos:limit])  # the unfinished line, for the next bytes
                    return
                line, pos = bytes(buffer[pos:limit]), limit
            else:
                if end + 1 - pos > MAX_LINE:
                    raise _BadAnswer("got more than 65536 bytes when reading "
                                     + ("status line" if self.status is None else "header line"))
                line, pos = bytes(buffer[pos:end + 1]), end + 1
            if self.status is None:
                if not line:
                    self._lost(_RemoteDisconnected("Remote end closed connection without response"))
                    return
                self._status_line(line)
                continue
            self.header_lines += 1
            if self.header_lines > MAX_HEADER_LINES:
                raise _BadAnswer(f"got more than {MAX_HEADER_LINES} headers")
            if line in (b"\r\n", b"\n", b""):
                if self.status == 100:  # skip an interim 100 Continue, as http.client does
                    self.status, self.headers, self.header_lines, self.headers_ended = None, {}, 0, False
                    if eof and pos >= limit:
                        self._lost(_RemoteDisconnected("Remote end closed connection without response"))
                        return
                    continue
                self._framing()
                self.buffer = bytearray()  # what is left of ``buffer`` is the body's
                self._body(memoryview(buffer)[pos:limit], eof=eof)
                return
            self._header(line.decode("iso-8859-1"))

    def _status_line(self, raw: bytes) -> None:
        line = raw.decode("iso-8859-1")
        parts = line.split(None, 2)
        version = parts[0] if len(parts) >= 2 else ""
        if not version.startswith("HTTP/"):
            raise _BadAnswer(line)
        try:
            status = int(parts[1])
        except ValueError:
            raise _BadAnswer(line) from None
        if status < 100 or status > 999:
            raise _BadAnswer(line)
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        elif status != 100:
            raise _BadAnswer(version)
        self.status = status

    def _header(self, line: str) -> None:
        """As ``email.parser`` reads headers for http.client: the first of a name counts; a line
        that is no header ends them (the rest is ignored); a folded line continues one."""
        if self.headers_ended or line[:1] in (" ", "\t"):
            return
        if not _HEADER.match(line):
            self.headers_ended = True
            return
        name, _, value = line.partition(":")
        self.headers.setdefault(name.lower(), value.strip())

    def _framing(self) -> None:
        headers, status = self.headers, self.status
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        connection = headers.get("connection", "").lower()
        if self.version == 11:
            will_close = "close" in connection
        else:
            will_close = not (headers.get("keep-alive") or "keep-alive" in connection
                              or "keep-alive" in headers.get("proxy-connection", "").lower())
        length = None
        if headers.get("content-length") and not self.chunked:
            try:
                length = int(headers["content-length"])
            except ValueError:
                length = None
            else:
                if length < 0:
                    length = None
        if status in (204, 304) or 100 <= status < 200:
            length = 0
        if not will_close and not self.chunked and length is None:
            will_close = True
        self.will_close, self.left = will_close, length
        self.limit = self.max_bytes if status < 300 else MAX_ERROR_BODY
        self.body = bytearray()
        self.mark = READ_SIZE  # the next point at which fetch.Client looks at the size
        self.chunk_left: int | None = None  # chunked: bytes left in this chunk (None: read a size line)
        self.trailer = False
        self.state = self.BODY

    def _body(self, data, eof: bool | None = None) -> None:
        eof = (not data) if eof is None else eof
        extra = False  # bytes past the answer's end: the connection is not reused
        if self.chunked:
            self.buffer += data
            ended = self._dechunk(eof)
            extra = bool(self.buffer)
        elif self.left is not None:
            take = data[:self.left]
            extra = len(data) > len(take)
            if not self.body and len(take) == self.left:
                self.body = bytes(take)  # all of it at once (the usual case): one copy, kept as is
            else:
                self.body += take
            self.left -= len(take)
            ended = self.left == 0
            if not ended and eof:
                # As fetch.Client (http.client's read(amt) does not raise on a short read): what
                # came is the answer, and the parser finds a page cut in a line unreadable.
                ended, extra = True, True
        else:
            self.body += data
            ended = eof
        if self._over_limit(ended):
            return
        if ended:
            self._complete(clean=not extra)

    def _dechunk(self, eof: bool) -> bool:
        """Move whole chunks from ``buffer`` into ``body``; True at the last chunk's trailer end."""
        buffer = self.buffer
        while True:
            if self.trailer:  # (read and dropped as http.client does, each line at most MAX_LINE)
                end = buffer.find(b"\n", 0, MAX_LINE)
                if end == -1:
                    if len(buffer) > MAX_LINE:
                        raise _BadAnswer("got more than 65536 bytes when reading trailer line")
                    if eof:
                        return True  # http.client: the trailer ends at EOF too
                    return False
                line = bytes(buffer[:end + 1])
                del buffer[:end + 1]
                if line in (b"\r\n", b"\n"):
                    return True
                continue
            if self.chunk_left is None:
                end = buffer.find(b"\n", 0, MAX_LINE)
                if end == -1:
                    if len(buffer) > MAX_LINE:
                        raise _BadAnswer("got more than 65536 bytes when reading chunk size")
                    if eof:
                        raise _BadAnswer("IncompleteRead(0 bytes read)")
                    return False
                line = bytes(buffer[:end + 1]).split(b";", 1)[0]
                del buffer[:end + 1]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise _BadAnswer("IncompleteRead(0 bytes read)") from None
                if size == 0:
                    self.trailer = True
                    continue
                self.chunk_left = size
            if self.chunk_left > 0:
                take = buffer[:self.chunk_left]
                self.body += take
                del buffer[:len(take)]
                self.chunk_left -= len(take)
                if self.chunk_left > 0:
                    if eof:
                        raise _BadAnswer(f"IncompleteRead({len(self.body)} bytes read)")
                    return False
            if len(buffer) < 2:  # the CRLF after a chunk's data
                if eof:
                    raise _BadAnswer(f"IncompleteRead({len(self.body)} bytes read)")
                return False
            del buffer[:2]
            self.chunk_left = None

    def _over_limit(self, ended: bool) -> bool:
        """fetch.Client reads 64 KiB at a time and checks the size after each read: same points here."""
        while len(self.body) >= self.mark or ended:
            size = min(len(self.body), self.mark)
            if size > self.limit:
                if self.status < 300:
                    self._fail(TOO_LARGE, f"answer exceeds {self.max_bytes} bytes", self.status)
                else:
                    self._end(Fetched(HTTP_ERROR, body=bytes(self.body[:self.limit]), http_status=self.status,
                                      error=f"HTTP {self.status}", elapsed=time.monotonic() - self.started,
                                      content_type=self._content_type()), keep=False)
                return True
            if ended and len(self.body) < self.mark:
                return False
            self.mark += READ_SIZE
        return False

    def _content_type(self) -> str:
        return self.headers.get("content-type", "")

    def _complete(self, clean: bool) -> None:
        elapsed = time.monotonic() - self.started
        keep = clean and not self.will_close
        body = bytes(self.body)  # (no copy when it is bytes already)
        if self.status >= 300:
            fetched = Fetched(HTTP_ERROR, body=body[:self.limit], http_status=self.status, error=f"HTTP {self.status}",
                              elapsed=elapsed, content_type=self._content_type())
        else:
            fetched = Fetched(OK, body=body, http_status=self.status, elapsed=elapsed,
                              content_type=self._content_type())
        self._end(fetched, keep=keep)

    # -- endings ------------------------------------------------------------------------------------
    def _timed_out(self) -> None:
        self.timer = None
        if self.finished:
            return
        if self.state == self.CONNECTING:
            self._fail(UNREACHABLE, f"connect to {self.host}:{self.port} timed out after {self.budget:g}s")
        elif self.state == self.BODY:
            self._fail(TIMEOUT, f"answer not complete within {self.budget:g}s", self.status)
        else:
            self._fail(TIMEOUT, f"connection accepted, no answer within {self.budget:g}s")

    def _fail(self, status: str, error: str, http_status: int | None = None) -> None:
        self._end(Fetched(status, http_status=http_status, error=error, elapsed=time.monotonic() - self.started),
                  keep=False)

    def _end(self, fetched: Fetched, keep: bool) -> None:
        if self.finished:
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._unwatch()
        if self.sock is not None:
            if keep:
                self.client.give_back((self.host, self.port), self.sock)
                self.sock = None
            else:
                self._drop_socket()
        self.done(fetched)

    def _drop_socket(self) -> None:
        self._unwatch()
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _watch(self, kind: str, callback) -> None:
        self._unwatch()
        fd = self.sock.fileno()
        if kind == "r":
            self.loop.add_reader(fd, self._guarded, callback)
        else:
            self.loop.add_writer(fd, self._guarded, callback)
        self.watching = (kind, fd)

    def _unwatch(self) -> None:
        if self.watching is not None:
            kind, fd = self.watching
            self.watching = None
            if kind == "r":
                self.loop.remove_reader(fd)
            else:
                self.loop.remove_writer(fd)

    def _guarded(self, callback) -> None:
        """A bug here must end this reading (as data), never leave it open or kill the loop."""
        try:
            callback()
        except Exception as exc:  # pragma: no cover - a bug, not a backend's doing
            if self.finished:
                raise  # raised by ``done`` itself: the reading has ended; the loop logs it
            self._fail(BROKEN if self.state == self.BODY else UNREACHABLE, f"internal error: {_short(exc)}",
                       self.status if self.state == self.BODY else None)


class _RemoteDisconnected(ConnectionResetError):
    """As http.client.RemoteDisconnected: closed before any byte of an answer."""


def _strerror(code: int) -> str:
    try:
        return os.strerror(code)
    except ValueError:  # pragma: no cover
        return f"error {code}"


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
