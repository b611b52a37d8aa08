"""A connected socket within a reading's deadline: name resolution, each address's connect and the
TLS context. ``getaddrinfo`` has no timeout of its own, so a host name is resolved on a resolver
thread that the reading waits for only as long as its budget allows; a name that is no valid host
name is a failed reading, not an exception. One TLS context serves every connection: building one
reads the system's CA store, too much work to repeat per connection.
"""
from __future__ import annotations

import functools
import ipaddress
import queue
import socket
import ssl
import threading

from .deadline import Deadline

RESOLVER_THREADS = 16  # host names resolved at once; more wait in line (within their own budgets)


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
            raise HostNameError(f"resolving {shown_host(host)} did not finish within the budget")
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
                lookup.error = HostNameError(f"{shown_host(lookup.host)} is not a valid host name ({exc})")
            except OSError as exc:
                lookup.error = HostNameError(f"cannot resolve {shown_host(lookup.host)}: {short_error(exc)}")
            except Exception as exc:  # noqa: BLE001 - any failure is this reading's, never the thread's end
                lookup.error = HostNameError(f"cannot resolve {shown_host(lookup.host)}: {short_error(exc)}")
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


def shown_host(host: str) -> str:
    return repr(host if len(host) <= 80 else host[:77] + "...")


def short_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
