"""HTTP for readings, on the running event loop: every byte of a request before one deadline.

How a request fails is itself the reading (refused: down; accepted but silent: wedged), so each
ending is told apart by the phase the request was in and named once (``answer.ENDINGS``). One
timer bounds resolving, connecting, the TLS handshake, sending and every read: a server that
drips its answer cannot hold a reading past it. Redirects are never followed, so a target's API
key only ever goes to that target.
"""
from __future__ import annotations

import asyncio
import functools
import json as jsonlib
import re
import ssl
import time
from urllib.parse import urlsplit

from .answer import ENDINGS, MAX_ERROR_BODY, MAX_PAGE_BYTES, USER_AGENT, Answer, BadAnswer, Fetched, ended
from .connect import Wire, connect, resolve, short_error, shown_host
from .deadline import Deadline
from .idlepool import IdlePool

__all__ = ["ENDINGS", "MAX_ERROR_BODY", "MAX_PAGE_BYTES", "USER_AGENT", "Client", "Fetched", "ended"]

_CONTROL = re.compile("[\x00-\x20\x7f]")            # what http.client refuses in a request's path


class _Request:
    """One request's state: which phase it is in says what its ending means."""

    __slots__ = ("phase", "wire", "reused", "answer", "expired")

    def __init__(self):
        self.phase, self.wire, self.reused, self.answer, self.expired = "resolving", None, False, None, False

    def expire(self, task: asyncio.Task) -> None:
        """The deadline's one timer: the request's task is cancelled wherever it waits (Python 3.10
        has no ``asyncio.timeout``; this is what it does)."""
        self.expired = True
        task.cancel()


class Client:
    """Requests with a deadline on the running loop, keeping up to ``max_idle`` idle keep-alive
    connections per loop and origin (a connection is its loop's: ``connect.Wire``). ``close`` on a
    loop before it closes (``check_async`` does, on the CLI's and the webhook's short loops);
    what a closed loop left is closed when the client next runs on another one."""

    def __init__(self, max_idle: int = 64):
        self.idle: IdlePool[Wire] = IdlePool(max_idle, usable=Wire.usable, close=Wire.close)
        self._loop: asyncio.AbstractEventLoop | None = None  # the last request's

    def close(self) -> None:
        self.idle.close()

    def finished(self, url: str) -> None:
        """Done with ``url``'s server until its next reading: its kept connections are closed now
        if it ends idle ones before then (``IdlePool.finished``)."""
        try:
            scheme, host, port = _origin(url)
        except ValueError:  # (_origin's IDNA errors are ValueErrors too)
            return
        self.idle.finished((self._loop, scheme, host, port))

    async def request(self, method: str, url: str, *, deadline: Deadline, max_bytes: int = MAX_PAGE_BYTES,
                      json: dict | None = None, headers: dict[str, str] | None = None) -> Fetched:
        """One HTTP request whose whole answer must arrive before ``deadline``."""
        started = time.monotonic()
        budget = max(0.0, deadline.left())
        try:
            scheme, host, port, head = _request_head(method, url, json is not None,
                                                     tuple(headers.items()) if headers else ())
        except (ValueError, UnicodeError) as exc:
            return ended("unreachable", started, why=short_error(exc))
        body = b"" if json is None else jsonlib.dumps(json).encode()
        data = head + (f"Content-Length: {len(body)}\r\n\r\n".encode() if body or method in ("POST", "PUT", "PATCH")
                       else b"\r\n") + body
        words = {"budget": budget, "host": host, "port": port, "max_bytes": max_bytes}
        task = asyncio.current_task()
        loop = task.get_loop()  # (each asyncio lookup of the loop is a getpid on 3.11: one, not two)
        if loop is not self._loop:
            self._loop = loop
            self.idle.close(lambda key: key[0].is_closed())  # (key: loop, then origin)
        key = (loop, scheme, host, port)
        for attempt in (0, 1):
            if budget <= 0 or deadline.expired:
                return ended("no_time", started, **words)
            state = _Request()
            timer = loop.call_later(deadline.left(), state.expire, task)
            try:
                fetched = await self._exchange(state, key, data, method, max_bytes, started)
            except asyncio.CancelledError:
                if not state.expired or (hasattr(task, "uncancel") and task.uncancel() > 0):
                    raise  # cancelled by the caller (too): theirs to handle
                return _timed_out(state, started, words)
            except (ConnectionResetError, BrokenPipeError) as exc:
                if state.answer is None or state.answer.status is None:  # closed before an answer's head
                    if state.reused and attempt == 0:
                        self.idle.dropped(key)
                        continue  # the server closed an idle keep-alive connection: once more, fresh
                    return ended("closed", started, why=short_error(exc))
                return _failed(state, started, exc)
            except ConnectionRefusedError:
                return ended("refused", started)
            except (OSError, BadAnswer, ssl.SSLError, UnicodeError, ValueError) as exc:
                return _failed(state, started, exc)
            finally:
                timer.cancel()
                if state.answer is not None:
                    state.answer.release()
                if state.wire is not None:
                    state.wire.close()
            return fetched
        raise AssertionError("unreachable")

    async def _exchange(self, state: _Request, key: tuple, data: bytes, method: str, max_bytes: int,
                        started: float) -> Fetched:
        loop, scheme, host, port = key
        wire = self.idle.take(key)
        state.reused = wire is not None
        if wire is None:
            addresses = await resolve(loop, host, port)
            state.phase = "connecting"  # (a TLS handshake that runs out of time: a connect that did)
            wire = await connect(loop, addresses, host, tls=scheme == "https")
        state.wire, state.phase = wire, "sending"
        wire.send(data)
        state.phase = "head"
        answer = state.answer = Answer(max_bytes, head_only=method == "HEAD")
        while not (answer.complete or answer.over):
            # (``more``: acknowledge at once. Only a reused connection needs it: on a fresh one the
            # kernel acknowledges the first segments at once by itself, bench/RESULTS-busy-spread.md.)
            received = await wire.recv(more=state.reused and answer.fed > 0)
            if not received:
                answer.eof()
                if not answer.complete:  # (http.client's RemoteDisconnected)
                    raise ConnectionResetError("Remote end closed connection without response")
                break
            answer.feed(received)
        status, body = answer.status, answer.body()
        if answer.keep_alive and not answer.over:  # (past the limit, the rest of it is unread)
            state.wire = None
            self.idle.give_back(key, wire)
        if answer.over and status < 300:
            return ended("too_large", started, http_status=status, max_bytes=max_bytes)
        if status >= 300:
            return ended("http_error", started, http_status=status, body=body[:MAX_ERROR_BODY],
                         content_type=answer.content_type)
        return ended("ok", started, http_status=status, body=body, content_type=answer.content_type)


@functools.lru_cache(maxsize=4096)
def _origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the host as it is connected to (an internationalized name
    as its IDNA form). Raises ValueError for a URL that is not http(s) with a host."""
    parts = urlsplit(url)
    scheme, host, port = parts.scheme, parts.hostname or "", parts.port
    if scheme not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {url[:80]!r}")
    if not host:
        raise ValueError(f"no host in {url[:80]!r}")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"{shown_host(host)} is not a valid host name ({exc})") from None
    return scheme, host, port or (443 if scheme == "https" else 80)


@functools.lru_cache(maxsize=4096)  # a reading asks the same few requests of a backend every scrape
def _request_head(method: str, url: str, has_json: bool, headers: tuple[tuple[str, str], ...]):
    """(scheme, host, port, the request's line and headers without the blank line). Raises
    ValueError for a URL or header that cannot go out as HTTP/1.1."""
    scheme, host, port = _origin(url)
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _CONTROL.search(path):
        raise ValueError(f"URL can't contain control characters: {path!r}")
    host_header = parts.netloc.rpartition("@")[2]
    if not host_header.isascii():  # an internationalized name goes out as its IDNA (xn--) form
        host_header = host + (f":{parts.port}" if parts.port else "")
    sent = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Host": host_header}
    if has_json:
        sent["Content-Type"] = "application/json"
    sent.update(headers)
    lines = [f"{method} {path} HTTP/1.1\r\n"]
    for name, value in sent.items():
        if _CONTROL.search(name) or "\r" in value or "\n" in value:
            raise ValueError(f"Invalid header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    return scheme, host, port, "".join(lines).encode("latin-1")


def _timed_out(state: _Request, started: float, words: dict) -> Fetched:
    """The deadline passed: what that means depends on how far the request got."""
    if state.phase == "resolving":
        return ended("unreachable", started, why=f"resolving {shown_host(words['host'])} did not finish within the budget")
    if state.phase == "connecting":
        return ended("connect_timeout", started, **words)
    if state.answer is not None and state.answer.status is not None:
        return ended("slow_answer", started, http_status=state.answer.status, **words)
    return ended("silent", started, **words)


def _failed(state: _Request, started: float, exc: BaseException) -> Fetched:
    if state.answer is not None and state.answer.status is not None:
        return ended("broken_off", started, http_status=state.answer.status, why=short_error(exc))
    return ended("unreachable", started, why=short_error(exc))
