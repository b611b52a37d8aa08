"""The endings that only a limit tells apart, on real sockets and on both loops: a connect that
never completes (unreachable: down, never the wedge of an accepted-but-silent server), a page that
never ends (cut off at the size cap: blind, not a timeout), and a silent server under a short
deadline (the reading ends at that deadline, not at some per-read timeout of its own). And the
idle pool's own limits (``hangwatch.idlepool.IdlePool``): a connection the server closed is never
handed out, at most ``max_idle`` are kept, the least recently used origin gives one up first; a
connection is never handed to another loop, and none outlives the short loop that made it.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hangwatch.check import check
from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.demo.wait import wait_until
from hangwatch.idlepool import RECHECK, IdlePool
from hangwatch.observation import BLIND, TIMEOUT, UNREACHABLE, Options
from hangwatch.observe import observe_backend
from hangwatch.verdict import judge
from tests.support.loops import LOOPS, run  # noqa: F401 (fixture)
from tests.support.pages import Page, PageServer


def observed(run, url: str, seconds: float):  # noqa: F811
    client = Client()
    try:
        return run(observe_backend(client, url, Deadline.after(seconds), Options(engine="vllm")))
    finally:
        client.close()


@pytest.fixture
def full_backlog():
    """A listening socket that never accepts, its one-place queue taken: the kernel drops further
    SYNs, so a connect() to it never completes — as a host that does not answer at all."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    taking = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        taking.close()
        listener.close()


def test_a_connect_that_never_completes_is_unreachable_not_a_stall(full_backlog, run):  # noqa: F811
    observation = observed(run, full_backlog, 0.5)
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation
    # twice in a row is still down: only an accepted connection that stays silent repeats into hung
    assert judge([observation, observation]).state == "down"


def test_a_page_that_never_ends_is_cut_off_at_the_size_cap_and_blind(run):  # noqa: F811
    server = PageServer()
    server.pages["/metrics"] = Page(chunks=itertools.repeat(b"# " + b"x" * 65534 + b"\n"))
    try:
        observation = observed(run, server.url, 10.0)
    finally:
        server.stop()
    assert (observation.status, judge([observation]).state) == (BLIND, "blind"), observation


def test_a_silent_server_ends_the_reading_at_a_short_deadline(run):  # noqa: F811
    server = PageServer()
    server.pages["/metrics"] = Page(silent=True)
    try:
        started = time.monotonic()
        observation = observed(run, server.url, 0.3)
        took = time.monotonic() - started
    finally:
        server.stop()
    assert observation.status == TIMEOUT
    assert took < 0.3 * 5, f"a 0.3 s reading took {took:.2f}s"  # the bound is the feature: generously


# -- the idle pool ---------------------------------------------------------------------------------
class Conn:
    def __init__(self, name: str, usable: bool = True):
        self.name, self.usable, self.closed = name, usable, False

    def close(self) -> None:
        assert not self.closed, f"{self.name} closed twice"
        self.closed = True


def pool(max_idle: int) -> IdlePool[Conn]:
    return IdlePool(max_idle, usable=lambda c: c.usable and not c.closed, close=Conn.close)


def test_the_last_connection_given_back_to_an_origin_is_the_first_taken():
    idle = pool(4)
    a1, a2 = Conn("a1"), Conn("a2")
    idle.give_back("a", a1)
    idle.give_back("a", a2)
    assert idle.take("a") is a2 and idle.take("a") is a1 and idle.take("a") is None
    assert idle.take("b") is None and len(idle) == 0


def test_a_connection_the_server_closed_is_closed_and_skipped_never_handed_out():
    idle = pool(4)
    good, dropped = Conn("good"), Conn("dropped")
    idle.give_back("a", good)
    idle.give_back("a", dropped)
    dropped.usable = False  # the server closed it while it was idle
    assert idle.take("a") is good
    assert dropped.closed and not good.closed and len(idle) == 0


def test_an_origin_whose_server_ended_an_idle_connection_has_them_closed_when_finished_and_rechecked():
    idle = pool(8)
    kept = Conn("kept")
    idle.give_back("a", kept)
    idle.finished("a")  # nothing known of "a": its connection stays
    assert not kept.closed and len(idle) == 1
    kept.usable = False  # the server ended it while it was idle
    assert idle.take("a") is None and kept.closed
    for n in range(RECHECK):  # from now on, closed when the caller is done
        conn = Conn(f"closed-first-{n}")
        idle.give_back("a", conn)
        idle.finished("a")
        assert conn.closed and len(idle) == 0
    recheck = Conn("recheck")
    idle.give_back("a", recheck)
    idle.finished("a")  # then one is kept, to see whether the server still ends them
    assert not recheck.closed and idle.take("a") is recheck  # it did not: kept from now on
    idle.give_back("a", recheck)
    idle.finished("a")
    assert not recheck.closed and len(idle) == 1
    idle.dropped("b")  # the client's own word (an idle one that failed when reused)
    idle.give_back("b", other := Conn("other"))
    idle.finished("b")
    assert other.closed


def test_past_max_idle_the_least_recently_used_origin_gives_up_its_oldest():
    idle = pool(3)
    a1, b1, a2, c1 = Conn("a1"), Conn("b1"), Conn("a2"), Conn("c1")
    for origin, conn in (("a", a1), ("b", b1), ("a", a2)):
        idle.give_back(origin, conn)
    idle.give_back("c", c1)  # "b" was used least recently ("a" moved to the end with a2)
    assert b1.closed and not (a1.closed or a2.closed or c1.closed)
    assert len(idle) == 3 and idle.take("b") is None


def test_max_idle_zero_keeps_nothing_and_close_ends_every_idle_connection():
    none_kept = pool(0)
    conn = Conn("x")
    none_kept.give_back("a", conn)
    assert conn.closed and none_kept.take("a") is None
    idle = pool(8)
    conns = [Conn(f"c{i}") for i in range(5)]
    for i, conn in enumerate(conns):
        idle.give_back(i % 2, conn)
    idle.close()
    assert all(conn.closed for conn in conns) and len(idle) == 0 and idle.take(0) is None


def test_threads_taking_and_giving_back_never_share_a_connection_or_lose_count():
    idle = pool(16)
    held: set[int] = set()
    lock = threading.Lock()
    errors: list[str] = []

    def worker(n: int) -> None:
        for i in range(2000):
            conn = idle.take(i % 3) or Conn(f"{n}-{i}")
            with lock:
                if id(conn) in held:
                    errors.append(f"{conn.name} handed to two takers")
                held.add(id(conn))
            with lock:
                held.discard(id(conn))
            idle.give_back(i % 3, conn)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert len(idle) <= 16


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_connection_is_never_handed_to_another_loop(run):  # noqa: F811
    """A connection belongs to the loop that made it: a ``Client`` used on two loops at once keeps
    one per loop, each reused on its own loop only."""
    server = PageServer()
    server.pages["/metrics"] = Page(b"a 1\n")
    client = Client(max_idle=5)
    loops = [LOOPS[run.kind](), asyncio.new_event_loop()]
    try:
        for loop in loops + loops:
            fetched = loop.run_until_complete(client.request("GET", server.url + "/metrics", deadline=Deadline.after(5)))
            assert fetched.body == b"a 1\n", fetched
        assert isinstance(client.idle, IdlePool) and client.idle.max_idle == 5
        assert len(client.idle) == 2 and server.connections == 2  # one per loop, reused on it
    finally:
        client.close()
        for loop in loops:
            loop.run_until_complete(asyncio.sleep(0))  # (an aborted connection's socket closes at a turn)
            loop.close()
        server.stop()
    assert len(client.idle) == 0


def test_what_a_closed_loop_left_idle_is_closed_when_the_client_runs_on_another():
    """Closing the client on its loop is the rule; a connection a closed loop left behind anyway
    (its socket still open on stock asyncio) is closed by the next request on another loop."""
    server = PageServer()
    server.pages["/metrics"] = Page(b"a 1\n")
    client = Client(max_idle=5)
    try:
        asyncio.run(client.request("GET", server.url + "/metrics", deadline=Deadline.after(5)))
        (left,) = [wire for wires in client.idle._idle.values() for wire in wires]
        assert left.loop.is_closed() and left.sock.fileno() >= 0
        assert asyncio.run(client.request("GET", server.url + "/metrics", deadline=Deadline.after(5))).body == b"a 1\n"
        assert left.sock.fileno() == -1 and len(client.idle) == 1 and server.connections == 2
    finally:
        client.close()
        server.stop()


def test_check_leaves_no_socket_open_after_its_loop_closes():
    """``check`` runs on a short loop of its own (``run_sync``) against a keep-alive server: the
    connection it kept between readings is closed before that loop is, so no descriptor is left."""
    server = PageServer()
    server.pages["/metrics"] = Page((Path(__file__).parent / "data" / "vllm-0.32" / "idle.prom").read_bytes())
    try:
        before = open_fds()
        result = check(server.url, interval=0.05, timeout=2)
        assert result.observations and server.connections < len(result.observations) * 3  # kept between readings
        wait_until(lambda: open_fds() <= before, 5, "every socket of the check closed", interval=0.01)
    finally:
        server.stop()


STUCK_LOOKUP = """
import socket, threading, time
real = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if host == "stuck.test":
        threading.Event().wait()  # a resolver that never answers
    return real(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo
from hangwatch.check import check
started = time.monotonic()
result = check("http://stuck.test:8000", interval=0.1, timeout=0.5)
print(result.verdict.state, round(time.monotonic() - started, 2), flush=True)
"""


def test_a_lookup_that_never_returns_does_not_hold_the_process_at_exit():
    """``check`` (the CLI's and the webhook's face) gives up on the lookup at its deadline and its
    loop's close leaves the lookup's thread behind: the process ends with its answer."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK_LOOKUP], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    verdict, seconds = done.stdout.split()
    assert done.returncode == 0 and verdict == "down", done.stderr
    assert float(seconds) < 0.5 * 3 + 2 and took < float(seconds) + 10, (seconds, took)
