"""A work slot comes back however its connection ends — even when the connection goes (evicted at a
full table, or reset) in the same loop round as its work was started, before the work's first step:
a coroutine cancelled before it starts never runs its body, so a ``finally`` in it never runs."""
from __future__ import annotations

import asyncio

from hangwatch.exporter.httpserver import BoundedHTTPServer, Connection, Response, Route


class Transport(asyncio.Transport):
    """Enough of a socket transport for one ``Connection``, driven by hand."""

    def __init__(self):
        super().__init__()
        self.closing, self.written = False, b""

    def get_extra_info(self, name, default=None):
        return ("127.0.0.9", 4242) if name == "peername" else default

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
