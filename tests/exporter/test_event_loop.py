"""``hangwatch.exporter.evloop``: the exporter server's loop keeps the promises asyncio's made it.

Timers fire in order and never once cancelled; a call from another thread wakes a sleeping
loop at once; a descriptor watched for reading and writing gets both; a callback that raises
is logged and the loop goes on; cancelled timers do not pile up.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from hangwatch.exporter.evloop import Loop, running


@pytest.fixture
def loop():
    loop = Loop()
    yield loop
    loop.close()


def run_for(loop: Loop, seconds: float) -> None:
    loop.call_later(seconds, loop.stop)
    loop.run_forever()


def test_timers_fire_in_time_order_and_a_cancelled_one_never(loop):
    fired = []
    loop.call_later(0.03, fired.append, "late")
    loop.call_later(0.01, fired.append, "early")
    loop.call_later(0.02, fired.append, "cancelled").cancel()
    loop.call_soon(fired.append, "soon")
    run_for(loop, 0.1)
    assert fired == ["soon", "early", "late"]


def asleep(thread_id: int) -> bool:
    """The thread is blocked in epoll_wait: the loop waiting for its next timer. (Where the kernel
    hides wchan, blocked at all: state S.)"""
    task = f"/proc/self/task/{thread_id}"
    wchan = open(f"{task}/wchan").read().strip()
    if wchan not in ("", "0"):
        return "epoll" in wchan
    return open(f"{task}/stat").read().rsplit(")", 1)[1].split()[0] == "S"


def test_a_call_from_another_thread_wakes_a_sleeping_loop_at_once(loop):
    woke, sent, seen_asleep = [], [], []
    loop.call_later(30, loop.stop)  # the loop would otherwise sleep 30 s
    turned = threading.Event()
    loop.call_soon(turned.set)  # after its first turn only the 30 s timer is due: it sleeps
    loop_thread = threading.get_native_id()

    def other_thread():
        # Sent once the loop is seen asleep (waited for, not slept for): the call must wake it.
        deadline = time.monotonic() + 10
        if turned.wait(10):
            while not asleep(loop_thread) and time.monotonic() < deadline:
                time.sleep(0.001)
            seen_asleep.append(asleep(loop_thread))
        sent.append(time.monotonic())
        loop.call_soon_threadsafe(lambda: (woke.append(time.monotonic()), loop.stop()))
    threading.Thread(target=other_thread).start()
    started = time.monotonic()
    loop.run_forever()
    assert seen_asleep == [True], "the loop was never seen asleep"
    assert woke and time.monotonic() - started < 15  # not the 30 s timer
    assert woke[0] - sent[0] < 1.0


def test_stop_from_another_thread(loop):
    seen_asleep = []
    loop_thread = threading.get_native_id()

    def stop_once_asleep():  # waited for, not slept for: the stop must wake the sleeping loop
        deadline = time.monotonic() + 10
        while not asleep(loop_thread) and time.monotonic() < deadline:
            time.sleep(0.001)
        seen_asleep.append(asleep(loop_thread))
        loop.stop_threadsafe()
    loop.call_soon(threading.Thread(target=stop_once_asleep).start)
    started = time.monotonic()
    loop.call_later(30, loop.stop)
    loop.run_forever()
    assert seen_asleep == [True], "the loop was never seen asleep"
    assert time.monotonic() - started < 15  # not the 30 s timer


def test_one_descriptor_read_and_written_gets_both_callbacks(loop):
    left, right = socket.socketpair()
    left.setblocking(False)
    events = []
    try:
        right.send(b"x")
        loop.add_reader(left.fileno(), lambda: (events.append("read"), left.recv(10), loop.remove_reader(left.fileno())))
        loop.add_writer(left.fileno(), lambda: (events.append("write"), loop.remove_writer(left.fileno())))
        run_for(loop, 0.1)
    finally:
        left.close()
        right.close()
    assert sorted(events) == ["read", "write"]


def test_a_callback_that_raises_is_logged_and_the_loop_goes_on(loop, caplog):
    after = []
    loop.call_soon(lambda: 1 / 0)
    loop.call_later(0.01, after.append, "still running")
    with caplog.at_level(logging.ERROR, logger="hangwatch.exporter.evloop"):
        run_for(loop, 0.05)
    assert after == ["still running"]
    assert "ZeroDivisionError" in caplog.text


def test_cancelled_timers_do_not_pile_up(loop):
    """Every request re-arms its connection's timer: a long-lived server must not keep them all."""
    loop.call_later(300, lambda: None)  # a live timer before them: popping the heap's top cannot clean up
    for _ in range(5000):
        loop.call_later(600, lambda: None).cancel()
    run_for(loop, 0.01)
    assert len(loop._timers) < 600


def test_running_names_the_loop_of_this_thread_only(loop):
    seen = []
    loop.call_soon(lambda: seen.append(running()))
    run_for(loop, 0.01)
    assert seen == [loop] and running() is None


def test_a_closed_loop_refuses_calls_from_threads():
    loop = Loop()
    loop.close()
    with pytest.raises(RuntimeError):
        loop.call_soon_threadsafe(lambda: None)
