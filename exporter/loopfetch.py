"""One GET on the exporter's event loop, with no thread: the busy-backend read.

On a worker thread (``fetch.Client``) a reading costs several thread wake-ups, more CPU than the
reading itself; here the loop that read the scrape request also reads the backend (``LoopGet``),
under ``fetch``'s rules. Only ``http://`` to an IP address: a host name or TLS would block, so
those go to ``fetch.Client`` on a worker thread (``can_get``).
"""
from __future__ import annotations

import functools
import ipaddress
import socket
from urllib.parse import urlsplit

from hangwatch.fetch import MAX_PAGE_BYTES, USER_AGENT, Deadline
from hangwatch.idlepool import IdlePool

from .loopget import Done, LoopGet

RECV = 262144
KEPT_REQUESTS = 20000   # encoded requests kept (one per target URL and API key)


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
    keep-alive connections (``IdlePool``). Not thread-safe: the loop's thread only."""

    def __init__(self, loop, max_idle: int = 256):
        self.loop = loop
        self.idle: IdlePool[socket.socket] = IdlePool(max_idle, usable=_alive, close=socket.socket.close)
        # Every read lands here first (one thread: the loop's): a fresh bytes object per recv()
        # costs an mmap and its page faults per reading (bench/RESULTS-exporter.md, "transport").
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
        LoopGet(self.loop, self.idle, self.landing, host, port, family, request, deadline, done, max_bytes).start()

    def close(self) -> None:
        self.idle.close()


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
