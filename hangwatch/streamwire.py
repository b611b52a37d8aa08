"""A plain (no TLS) connection read through uvloop's transport instead of its ``sock_*`` calls.

uvloop's ``sock_recv`` makes and closes a libuv poll handle on every wait: seven syscalls
(epoll_ctl ADD, DEL, DEL, DEL, ioctl, io_uring_enter...) for a request's one ``recvfrom``, about
half of what a busy backend's reading costs the client (bench/RESULTS-probe-cpu.md). A
transport keeps its socket in the loop's epoll for the connection's life; its bytes wait here
for ``recv``. The connection then belongs to the loop that made it, so this is only for a loop
that runs for the process's life (the exporter's: ``own_connections``): a ``Client`` shared by
``asyncio.run`` calls keeps plain sockets any loop can use. ``client._Wire`` keeps serving TLS,
stock asyncio (whose ``sock_*`` calls cost no more than a transport's) and every other loop.
"""
from __future__ import annotations

import asyncio
import socket
import weakref

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux
HIGH_WATER = 65536  # bytes kept unread before the transport stops reading (a page no one reads is bounded)


_OWNERS: weakref.WeakSet = weakref.WeakSet()  # the loops whose plain connections are their transports


def own_connections(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` runs for the process's life: on uvloop, its plain connections are its transports."""
    if type(loop).__module__.startswith("uvloop"):
        _OWNERS.add(loop)


def streams_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether plain connections on ``loop`` are read through its transports."""
    return loop in _OWNERS


class _Stream(asyncio.Protocol):
    """What the transport delivers, kept until ``StreamWire.recv`` takes it."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.paused = self.ended = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size >= HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class StreamWire:
    """``client._Wire``'s surface (send, recv, usable, close) over a transport on ``loop``."""

    __slots__ = ("loop", "transport", "stream", "sock")

    def __init__(self, loop, transport: asyncio.Transport, stream: _Stream):
        self.loop, self.transport, self.stream = loop, transport, stream
        self.sock = transport.get_extra_info("socket")

    @classmethod
    async def over(cls, loop, sock: socket.socket) -> StreamWire:
        """``sock`` (connected) handed to ``loop``'s transport."""
        transport, stream = await loop.connect_accepted_socket(_Stream, sock)
        return cls(loop, transport, stream)

    async def send(self, loop, data: bytes) -> None:
        if self.stream.error is not None:
            raise self.stream.error
        self.transport.write(data)

    async def recv(self, loop) -> bytes:
        """What arrived (b"": the server closed)."""
        stream = self.stream
        while True:
            chunks = stream.chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                stream.size = 0
                if stream.paused:
                    stream.paused = False
                    self.transport.resume_reading()
                return data
            if stream.error is not None:
                raise stream.error
            if stream.ended:
                return b""
            if _QUICKACK is not None:
                # As client._Wire.recv: our ACK at once, so a server writing head and body apart
                # with Nagle on does not wait for our delayed one.
                self.sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            stream.waiter = loop.create_future()
            try:
                await stream.waiter
            finally:
                stream.waiter = None

    def usable(self) -> bool:
        """False when the server closed it, it holds stray bytes, or another loop asks."""
        stream = self.stream
        return (not (stream.ended or stream.chunks or self.transport.is_closing())
                and asyncio._get_running_loop() is self.loop)

    def close(self) -> None:
        if self.loop.is_closed():
            return  # (its transports were closed with it)
        if asyncio._get_running_loop() is self.loop:
            self.transport.abort()
        else:
            self.loop.call_soon_threadsafe(self.transport.abort)
