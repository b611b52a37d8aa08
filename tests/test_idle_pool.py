"""``hangwatch.idlepool.IdlePool``: the one idle keep-alive pool of both clients (``fetch.Client`` on
threads, the exporter's ``LoopClient`` on its loop) keeps its promises: a connection the server closed
is never handed out, at most ``max_idle`` are kept, the least recently used origin gives one up first."""
from __future__ import annotations

import threading

from hangwatch.exporter.evloop import Loop
from hangwatch.exporter.loopfetch import LoopClient
from hangwatch.fetch import Client
from hangwatch.idlepool import IdlePool


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


def test_both_clients_keep_their_idle_connections_in_the_one_pool():
    client = Client(max_idle=5)
    loop = Loop()
    try:
        loop_client = LoopClient(loop, max_idle=7)
        assert isinstance(client.idle, IdlePool) and client.idle.max_idle == 5
        assert isinstance(loop_client.idle, IdlePool) and loop_client.idle.max_idle == 7
    finally:
        client.close()
        loop.close()
