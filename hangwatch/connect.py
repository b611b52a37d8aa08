"""A reading's connection: resolved by us, connected address by address, read as a transport.

Every connection — plain or TLS, uvloop or stock asyncio — is a transport with one small
protocol, ``Wire``: the socket stays in the loop's poller for the connection's life (uvloop's
``sock_recv`` made and dropped a poll handle per wait, bench/RESULTS-probe-cpu.md) and TLS is
the loop's own. Resolving and each address's connect are separate steps, so a deadline can tell
which of them it ended. A connection belongs to the loop that made it (``Client`` keeps it per
loop). A busy backend is connected afresh every scrape (it closes an idle connection after 5 s,
a scrape comes every 15 s), so connecting is on the busy path and is kept cheap.
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux
HIGH_WATER = 65536  # bytes kept unread before the transport stops reading (a page no one reads is bounded)


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The one TLS configuration (the system's CA store, host names checked), built once and
    shared: building one reads the CA store, too much work per connection."""
    return ssl.create_default_context()


def shown_host(host: str) -> str:
    return repr(host if len(host) <= 80 else host[:77] + "...")


def short_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class Wire(asyncio.Protocol):
    """One connection: what its transport delivers is kept until ``recv`` takes it (past
    ``HIGH_WATER`` unread bytes the transport stops reading), its end recorded, one reader waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket | None):
        self.loop, self.sock = loop, sock  # (our socket, on asyncio's loop: ours to close once it is closed)
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.paused = self.ended = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport, self.tcp = transport, transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size >= HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True  # (over TLS also a close without close_notify: an end, as http.client read one)
        self._wake()
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended, self.error = True, exc
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def send(self, data: bytes) -> None:
        self.transport.write(data)  # (to a connection already lost: nothing; ``recv`` says why)

    async def recv(self, more: bool = False) -> bytes:
        """What arrived since the last call (b"": the server closed). ``more``: part of the answer
        has come, the rest is awaited."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.ended:
                return b""
            if more and _QUICKACK is not None:
                # Acknowledge what came at once: on a reused connection a server that writes its
                # headers and body separately with Nagle on (cpp-httplib's default) would otherwise
                # wait for our delayed ACK before sending the body (bench/RESULTS-client.md). Set
                # with an ACK pending, the kernel sends it now; before anything came there is
                # nothing to acknowledge (and on uvloop each call builds a socket object, a
                # getsockname and a setsockopt: the caller asks only on a reused connection).
                self.tcp.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.size = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return data

    def usable(self) -> bool:
        """False when the server closed it or it holds stray bytes (an idle connection's checks)."""
        return not (self.ended or self.chunks or self.transport.is_closing())

    def close(self) -> None:
        """Ends the connection from any thread, its loop running or not."""
        if self.loop.is_closed():
            if self.sock is not None:  # (uvloop's: closed with its loop)
                self.sock.close()  # its transport will never run again
        elif self.loop.is_running() and asyncio._get_running_loop() is not self.loop:
            self.loop.call_soon_threadsafe(self.transport.abort)  # another thread's loop
        else:
            self.transport.abort()  # (the socket closes at the loop's next turn)


@functools.lru_cache(maxsize=4096)  # the same few backends every scrape
def _literal_family(host: str):
    """The address family of an IP address literal; None for a name."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


async def resolve(loop, host: str, port: int) -> list:
    """(family, address) per address of ``host`` (an address literal needs no lookup)."""
    family = _literal_family(host)
    if family is not None:
        return [(family, (host, port))]
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError as exc:  # IDNA: a label over 63 characters, an empty label (a..b)
        raise OSError(f"{shown_host(host)} is not a valid host name ({exc})") from None
    except OSError as exc:
        raise OSError(f"cannot resolve {shown_host(host)}: {short_error(exc)}") from None
    return [(family, address) for family, _, _, _, address in found]


async def connect(loop, addresses: list, host: str, tls: bool) -> Wire:
    """A ``Wire`` to the first of ``addresses`` that accepts (the last one's error otherwise),
    its TLS handshake for ``host`` done when ``tls``."""
    error: OSError | None = None
    context, server_hostname = (tls_context(), host) if tls else (None, None)
    for family, address in addresses:
        try:
            if isinstance(loop, asyncio.BaseEventLoop):
                return await _connect_own_socket(loop, family, address, context, server_hostname)
            # uvloop connects in C (no Python socket, no poll handle of its own), and closes every
            # connection it holds when it closes: there is no socket left for us to close. (Not
            # its ``sock_connect``: that resolves even an IP address again, through its resolver's
            # thread pool — a busy fleet connects afresh every scrape, bench/RESULTS-busy-spread.md.)
            _, wire = await loop.create_connection(lambda: Wire(loop, None), address[0], address[1], family=family,
                                                   ssl=context, server_hostname=server_hostname)
            return wire
        except ssl.SSLError:
            raise  # the handshake: the address accepted
        except OSError as exc:
            error = exc
    raise error or OSError(f"no address for {shown_host(host)}")


async def _connect_own_socket(loop, family: int, address, context, server_hostname) -> Wire:
    """asyncio's own loop leaves a connection open when it closes: the socket stays ours to close."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)  # (asyncio's: an IP address is not looked up again)
        _, wire = await loop.create_connection(lambda: Wire(loop, sock), sock=sock, ssl=context,
                                               server_hostname=server_hostname)
    except BaseException:
        sock.close()
        raise
    return wire
