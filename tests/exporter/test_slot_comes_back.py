"""A work slot comes back however its connection ends — even when the connection goes (evicted at a
full table, or reset) in the same loop round as its work was started, before the work's first step:
a coroutine cancelled before it starts never runs its body, so a ``finally`` in it never runs. And
a freed slot goes to waiting work one address after another, not to the address queued most."""
from __future__ import annotations

import asyncio

from hangwatch.exporter.httpserver import BoundedHTTPServer, Connection, Response, Route


class Transport(asyncio.Transport):
    """Enough of a socket transport for one ``Connection``, driven by hand."""

    def __init__(self, address: str = "127.0.0.9"):
        super().__init__()
        self.address, self.closing, self.written = address, False, b""

    def get_extra_info(self, name, default=None):
        return (self.address, 4242) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def write(self, data):
        self.written += data

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    abort = close


def test_work_cancelled_before_its_first_step_gives_its_slot_back():
    started = []

    async def work(request):
        started.append(request.path)
        return Response(200, "text/plain", b"ok\n")

    server = BoundedHTTPServer(("127.0.0.1", 0), {"/work": Route(work)}, workers=1)
    head = b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n"

    async def scenario():
        gone = Connection(server)
        gone.connection_made(Transport())
        gone.data_received(head)          # its work starts: the slot is taken
        assert server.stats.work_running == 1
        gone.abort()                      # and it goes before the work's first step
        deadline = asyncio.get_running_loop().time() + 5
        while server.stats.work_running:
            assert asyncio.get_running_loop().time() < deadline, "the slot stayed taken"
            await asyncio.sleep(0.01)
        answered = Transport()
        kept = Connection(server)
        kept.connection_made(answered)
        kept.data_received(head)          # the one slot is free again: this work runs
        while b"\r\n\r\nok\n" not in answered.written:
            assert asyncio.get_running_loop().time() < deadline, answered.written
            await asyncio.sleep(0.01)
        kept.abort()
        assert server.stats.connections_open == 0 and not server.admission.clients

    try:
        asyncio.run(scenario())
    finally:
        server.server_close()
    assert started == ["/work"]


def test_a_freed_slot_goes_to_the_next_address_in_turn():
    started, release = [], {}

    async def work(request):
        started.append(request.query)
        release[request.query] = asyncio.Event()
        await release[request.query].wait()
        return Response(200, "text/plain", b"ok\n")

    server = BoundedHTTPServer(("127.0.0.1", 0), {"/work": Route(work, start_within=lambda request: 30.0)},
                               workers=1)

    async def scenario():
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        connections = []
        for address, name in (("127.0.0.2", "a1"), ("127.0.0.2", "a2"), ("127.0.0.2", "a3"), ("127.0.0.3", "b1")):
            connection = Connection(server)
            connection.connection_made(Transport(address))
            connection.data_received(f"GET /work?{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            connections.append(connection)
            while name == "a1" and not started:
                assert loop.time() < deadline, "the first work never started"
                await asyncio.sleep(0.01)
        for name in ("a1", "a2", "b1", "a3"):
            while name not in release:
                assert loop.time() < deadline, (name, started)
                await asyncio.sleep(0.01)
            release[name].set()
        for connection in connections:
            connection.abort()

    try:
        asyncio.run(scenario())
    finally:
        server.server_close()
    assert started == ["a1", "a2", "b1", "a3"]
