"""One GET's life on the loop: connect, send, read (``AnswerReader``), end — once, by its
``Deadline`` at the latest. A single timer at the deadline closes the socket, so a server that
drips bytes cannot hold a reading past it; refused, unreachable, accepted but silent and broken are
told apart as ``fetch.Client`` tells them; an idle keep-alive connection the server had closed is
retried once, fresh. Every call and callback runs on the loop's own thread.
"""
from __future__ import annotations

import errno
import os
import socket
import time
from typing import Callable

from hangwatch.connect import short_error
from hangwatch.fetch import BROKEN, REFUSED, TIMEOUT, UNREACHABLE, Deadline, Fetched
from hangwatch.idlepool import IdlePool

from .loopanswer import AnswerReader, BadAnswer, RemoteDisconnected

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)

Done = Callable[[Fetched], None]


class LoopGet(AnswerReader):
    """One request's state: connect -> send -> head -> body; one timer at the deadline.

    Passed what it uses of its client (the loop, the idle pool, the landing buffer), not the
    client itself: the client makes ``LoopGet``s, so a reference back would be a circle."""

    CONNECTING, SENDING, HEAD, BODY = "connecting", "sending", "head", "body"

    def __init__(self, loop, idle: IdlePool[socket.socket], landing: memoryview, host, port, family,
                 request: bytes, deadline: Deadline, done: Done, max_bytes: int):
        self.loop, self.idle, self.landing = loop, idle, landing
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
        self._begin(self.idle.take((self.host, self.port)))

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
            self._fail(UNREACHABLE, f"connection failed: {short_error(exc)}")
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
            self._fail(UNREACHABLE, f"connection failed: {short_error(OSError(code, _strerror(code)))}")

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
                self._fail(UNREACHABLE, f"connection failed: {short_error(exc)}")
            else:
                self._lost(exc)
            return
        except OSError as exc:
            self._fail(UNREACHABLE, f"connection failed: {short_error(exc)}")
            return
        self.state = self.HEAD
        self._watch("r", self._readable)

    def _readable(self) -> None:
        try:
            if _QUICKACK is not None:
                self.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # as fetch: no delayed ACK
            landing = self.landing
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
        except BadAnswer as exc:
            if self.state == self.HEAD:
                self._fail(UNREACHABLE, f"connection failed: {short_error(exc)}")
            else:
                self._fail(BROKEN, f"answer broken off: {short_error(exc)}", self.status)

    def _lost(self, exc: BaseException) -> None:
        """The connection broke (reset, pipe) or closed before the answer's head was read."""
        if self.state == self.BODY:
            self._fail(BROKEN, f"answer broken off: {short_error(exc)}", self.status)
            return
        if self.state == self.HEAD and not isinstance(exc, (ConnectionResetError, BrokenPipeError,
                                                             RemoteDisconnected)):
            self._fail(UNREACHABLE, f"connection failed: {short_error(exc)}")
            return
        if self.reused and not self.retried:  # the server closed an idle keep-alive connection
            self.retried = True
            self._drop_socket()
            self._begin(None)
            return
        self._fail(BROKEN, f"connection closed without an answer: {short_error(exc)}")

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
                self.idle.give_back((self.host, self.port), self.sock)
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
            self._fail(BROKEN if self.state == self.BODY else UNREACHABLE, f"internal error: {short_error(exc)}",
                       self.status if self.state == self.BODY else None)


def _strerror(code: int) -> str:
    try:
        return os.strerror(code)
    except ValueError:  # pragma: no cover
        return f"error {code}"
