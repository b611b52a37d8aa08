"""A work slot comes back however its connection ends — even when the connection goes (evicted at a
full table, or reset) in the same loop round as its work was started, before the work's first step:
a coroutine cancelled before it starts never runs its body, so a ``finally`` in it never runs. And
a freed slot goes to waiting work one address after another, not to the address queued most.
Work that pauses (an idle probe's confirmation wait, ``Connection.pause``) lends its slot out
meanwhile, gets one again before work not yet started, and is told when none came in time."""
from __future__ import annotations

import asyncio

import pytest

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


def drive(server: BoundedHTTPServer, scenario) -> None:
    try:
        asyncio.run(scenario())
    finally:
        server.server_close()


async def until(condition, what, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


def open_work(server: BoundedHTTPServer, name: str, address: str = "127.0.0.2") -> tuple[Connection, Transport]:
    transport = Transport(address)
    connection = Connection(server)
    connection.connection_made(transport)
    connection.data_received(f"GET /work?{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return connection, transport


def test_paused_work_lends_its_slot_out_and_gets_one_again_before_work_not_yet_started():
    events, release, paused = [], {}, {}

    async def work(request):
        events.append(f"start {request.query}")
        if request.query == "pauser":
            paused["pauser"] = await request.slot.pause(0.05, 30.0)
            events.append("pauser resumed")
        else:
            release[request.query] = asyncio.Event()
            await release[request.query].wait()
        return Response(200, "text/plain", b"ok\n")

    server = BoundedHTTPServer(("127.0.0.1", 0), {"/work": Route(work, start_within=lambda request: 30.0)},
                               workers=1)

    async def scenario():
        pauser, answered = open_work(server, "pauser")
        await until(lambda: events == ["start pauser"], events)
        lender, _ = open_work(server, "lent", "127.0.0.3")  # the slot the pauser lent out
        await until(lambda: "lent" in release, events)
        assert server.stats.work_running == 1
        await asyncio.sleep(0.1)                           # the pauser's wait is over: it waits for a slot
        waiting, _ = open_work(server, "waiting", "127.0.0.4")
        await asyncio.sleep(0.02)
        assert events == ["start pauser", "start lent"], "work ran while its slot was lent out"
        assert server.stats.work_waiting == 2  # the paused work and the new one
        release["lent"].set()                              # the slot goes to the pauser, not to "waiting"
        await until(lambda: "waiting" in release, events)
        assert events == ["start pauser", "start lent", "pauser resumed", "start waiting"]
        assert paused == {"pauser": True} and b"\r\n\r\nok\n" in answered.written
        release["waiting"].set()
        await until(lambda: server.stats.work_running == 0, "a slot stayed taken")
        for connection in (pauser, lender, waiting):
            connection.abort()
        assert server.admission.free_slots == 1 and not server.admission.resuming

    drive(server, scenario)


def test_paused_work_that_gets_no_slot_in_time_is_told_so_and_gives_back_nothing():
    paused = {}

    async def work(request):
        if request.query == "pauser":
            paused["pauser"] = await request.slot.pause(0.01, 0.05)
        else:
            paused["holder"] = asyncio.Event()
            await paused["holder"].wait()
        return Response(200, "text/plain", b"ok\n")

    server = BoundedHTTPServer(("127.0.0.1", 0), {"/work": Route(work, start_within=lambda request: 30.0)},
                               workers=1)

    async def scenario():
        pauser, answered = open_work(server, "pauser")
        await until(lambda: server.stats.work_running == 0, "the pauser kept its slot")
        holder, _ = open_work(server, "holder", "127.0.0.3")
        await until(lambda: "pauser" in paused, "the pauser's wait has no end")
        assert paused["pauser"] is False and b"\r\n\r\nok\n" in answered.written
        assert server.stats.work_running == 1, "the pauser gave back a slot it did not hold"
        paused["holder"].set()
        await until(lambda: server.stats.work_running == 0, "a slot stayed taken")
        assert server.admission.free_slots == 1 and not server.admission.resuming
        pauser.abort()
        holder.abort()

    drive(server, scenario)


@pytest.mark.parametrize("when", ["sleeping", "waiting for a slot", "handed a slot"])
def test_a_connection_gone_while_its_work_pauses_leaves_every_slot_counted_once(when):
    """"handed a slot": the slot is handed to the paused work and its connection goes in the same
    loop round, before the work takes it up."""
    holder = {}

    async def work(request):
        if request.query == "pauser":
            await request.slot.pause(0.2 if when == "sleeping" else 0.01, 30.0)
            await asyncio.sleep(30)  # (never reached when the connection is gone first)
        else:
            holder["event"] = asyncio.Event()
            await holder["event"].wait()
            if when == "handed a slot":  # runs after this work's end hands the pauser its slot
                asyncio.get_running_loop().call_soon(holder["pauser"].abort)
        return Response(200, "text/plain", b"ok\n")

    server = BoundedHTTPServer(("127.0.0.1", 0), {"/work": Route(work, start_within=lambda request: 30.0)},
                               workers=1)

    async def scenario():
        pauser, _ = open_work(server, "pauser")
        holder["pauser"] = pauser
        await until(lambda: server.stats.work_running == 0, "the pauser kept its slot")
        if when != "sleeping":
            open_work(server, "holder", "127.0.0.3")
            await until(lambda: server.admission.resuming, "the pauser never asked for its slot again")
        if when != "handed a slot":
            pauser.abort()                # gone: its work is cancelled wherever it is
        if when != "sleeping":
            holder["event"].set()
        await until(lambda: server.stats.work_running == 0, "a slot stayed taken")
        await asyncio.sleep(0.05)
        assert server.admission.free_slots == 1 and not server.admission.resuming
        assert server.stats.connections_open <= 1

    drive(server, scenario)
