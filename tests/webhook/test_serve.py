"""The webhook behind its real server (``hangwatch.webhook.server.serve``, waitress) on loopback.

Slow clients: hundreds of connections that send half a request header and then nothing must
not cost a thread each, must not keep /healthz, /metrics or a real alert from being served,
and must be closed after ``channel_timeout``. Stopping: a restart under way finishes before
``serve`` returns; a job still re-checking is abandoned at once and restarts nothing.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from hangwatch.webhook.server import CONNECTION_LIMIT, serve

from .conftest import Harness
from .fakes import TOKEN, payload
from .real_parts import wait_for

HALF_OPEN = CONNECTION_LIMIT - 16  # all held open at once, with room left for the checks


class Served:
    """A Harness app served by ``serve()`` in a thread; ``stop()`` asks it to stop as SIGTERM does."""

    def __init__(self, state_dir, *, limits=None, **harness):
        self.h = Harness(state_dir, **harness)
        self.code = None
        ready = threading.Event()
        box = {}

        def on_ready(server):
            box["server"] = server
            ready.set()

        def run():
            self.code = serve(self.h.app, "127.0.0.1", 0, install_signals=False, ready=on_ready, **(limits or {}))

        self.thread = threading.Thread(target=run, name="test-serve", daemon=True)
        self.thread.start()
        assert ready.wait(10), "the server did not start"
        self.server = box["server"]
        self.url = f"http://127.0.0.1:{self.server.port}"

    def stop(self):
        self.server.request_stop()


@pytest.fixture
def served(tmp_path):
    made = []

    def start(**kwargs):
        made.append(Served(tmp_path / f"state{len(made)}", **kwargs))
        return made[-1]

    yield start
    for item in made:
        item.stop()
        item.thread.join(30)
        if item.h.rechecker.gate is not None:
            item.h.rechecker.gate.set()
        if item.h.restarter.restart_gate is not None:
            item.h.restarter.restart_gate.set()


def half_open(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that each send the start of a request header and then nothing."""
    port = int(url.rsplit(":", 1)[1])
    sockets = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port), timeout=5)
        connection.sendall(b"POST /alerts HTTP/1.1\r\nHost: webhook\r\nAuthorization: Bea")
        sockets.append(connection)
    return sockets


def closed_by_server(connection: socket.socket) -> bool:
    connection.setblocking(False)
    try:
        return connection.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_half_open_connections_hold_no_thread_and_block_nothing(served):
    """Before (Werkzeug's dev server): 300 half-open connections held 300 threads, forever."""
    s = served(limits={"channel_timeout": 3, "cleanup_interval": 1})
    assert requests.get(s.url + "/healthz", timeout=5).status_code == 200
    threads_before = threading.active_count()
    sockets = half_open(s.url, HALF_OPEN)
    try:
        # Answered past the half-open ones: a request blocked behind them ends at its 5 s timeout
        # (no tighter wall-clock bound: the machine may be loaded).
        health = requests.get(s.url + "/healthz", timeout=5)
        assert health.status_code == 200
        metrics = requests.get(s.url + "/metrics", timeout=5)
        assert metrics.status_code == 200 and "hangwatch_webhook_requests_total" in metrics.text
        assert threading.active_count() - threads_before <= 1, "a connection must not hold a thread"
        answer = requests.post(s.url + "/alerts", json=payload(s.h.alert()), timeout=5,
                               headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200 and answer.json()["queued"] == ["vllm-a"]
        s.h.settle()
        assert s.h.restarter.restarts == [("vllm-a", 30.0)]
        # The server closes them once they have been idle for channel_timeout.
        wait_for(lambda: all(closed_by_server(c) for c in sockets), 15, "the server to close half-open connections")
    finally:
        for connection in sockets:
            connection.close()


def test_past_the_connection_limit_new_clients_wait_until_idle_ones_are_closed(served):
    s = served(limits={"channel_timeout": 2, "cleanup_interval": 1, "connection_limit": 50})
    sockets = half_open(s.url, 80)
    try:
        health, took = timed(lambda: requests.get(s.url + "/healthz", timeout=15))
        assert health.status_code == 200, health.text
        assert took < 8, f"waited {took:.1f}s: idle connections are closed after 2 s"
    finally:
        for connection in sockets:
            connection.close()


def test_stop_lets_a_restart_under_way_finish(served):
    s = served()
    s.h.restarter.restart_gate = threading.Event()
    requests.post(s.url + "/alerts", json=payload(s.h.alert()), headers={"Authorization": f"Bearer {TOKEN}"},
                  timeout=5).raise_for_status()
    assert s.h.restarter.restart_started.wait(10)
    s.stop()  # SIGTERM while `docker restart` runs
    wait_for(lambda: closed_listener(s.url), 5, "the listener to close")
    assert s.thread.is_alive(), "serve returned while the restart was still under way"
    s.h.restarter.restart_gate.set()
    s.thread.join(10)
    assert not s.thread.is_alive() and s.code == 0
    assert [(d["reason"], d.get("result")) for d in s.h.decisions()] == [("hung", "ok")]
    assert s.h.restarter.restarts == [("vllm-a", 30.0)]


def test_stop_abandons_a_job_still_rechecking_and_restarts_nothing(served):
    s = served()
    s.h.rechecker.gate = threading.Event()
    requests.post(s.url + "/alerts", json=payload(s.h.alert()), headers={"Authorization": f"Bearer {TOKEN}"},
                  timeout=5).raise_for_status()
    wait_for(lambda: s.h.rechecker.calls, 5, "the re-check to start")
    started = time.monotonic()
    s.stop()
    s.thread.join(10)
    assert not s.thread.is_alive() and s.code == 0
    assert time.monotonic() - started < 3, "stopping waited for the re-check"
    s.h.rechecker.gate.set()  # the re-check says hung, after the stop
    assert s.h.state.wait_idle(10)
    assert s.h.restarter.restarts == []
    assert [d["reason"] for d in s.h.decisions()] == ["shutting_down"]


def closed_listener(url: str) -> bool:
    try:
        requests.get(url + "/healthz", timeout=1)
        return False
    except requests.ConnectionError:
        return True


def test_the_listening_line_names_the_port_it_got(served, caplog):
    """Before: waitress gives the port as text, ``%d`` failed, and the line was never logged."""
    import logging
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    s = served()
    assert isinstance(s.server.port, int)
    # ``ready`` runs just before the line is logged (signal handlers first): wait for it, on a loaded machine too
    wait_for(lambda: f"webhook listening on http://127.0.0.1:{s.server.port}" in caplog.text, 10, "the listening line")
