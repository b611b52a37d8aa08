"""hangwatch's FastChat modules against a real FastChat 0.2.36 deployment.

Busy → no probe; frozen (kill -STOP) → hung within two intervals; killed → down; and the
controller and API server checks — a day's worth of them — leave dispatch and registration
as they were, shown by the controller's own log (it logs every registration, heartbeat and
dispatch) and the workers' access logs.
"""
import asyncio
import re
import socket
import threading
import time

import pytest
import requests

from hangwatch import fastchat
from hangwatch.check import check
from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.demo.wait import wait_until
from hangwatch.modules import observe
from hangwatch.verdict import judge
from tests.real_fastchat.fleet import HEARTBEAT_INTERVAL, MODEL_NAME, generate_stream

pytestmark = pytest.mark.real

INTERVAL = 1.0
TIMEOUT = 0.5
# The worker's own probe endpoint in its access log (not /worker_generate_stream, the load).
PROBE_LINE = re.compile(r'"POST /worker_generate HTTP')


class Load:
    """A long generation sent straight to a worker, in a thread (as the API server would).

    :meth:`cancel` hangs up once the test has seen what it needs: the worker stops generating
    for a client that is gone, instead of the test waiting thousands of tokens for nothing."""

    def __init__(self, worker_url: str, max_new_tokens: int = 6000):
        self.error = None
        self.response = None
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(worker_url, max_new_tokens), daemon=True)
        self.thread.start()

    def _run(self, url, n):
        try:
            with generate_stream(url, n) as response:
                self.response = response
                if self.cancelled.is_set():
                    return
                for _ in response.iter_content(None):
                    if self.cancelled.is_set():
                        return
        except (requests.RequestException, AttributeError, ValueError) as exc:
            if not self.cancelled.is_set():
                self.error = exc

    def join(self, timeout=300):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the generation still runs after {timeout}s"

    def cancel(self, timeout=30):
        """Hang up; returns the error the load met before (None: it streamed until now)."""
        self.cancelled.set()
        if self.response is not None:
            try:  # wakes the reading thread at once, and the worker sees the client gone
                self.response.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
            except (AttributeError, OSError):
                self.response.close()
        self.join(timeout)
        return self.error


def observe_every(url, module, until, interval=INTERVAL, timeout=TIMEOUT, limit=20):
    """Observe ``url`` every ``interval`` seconds; return the observations once ``until(verdict)``."""
    observations, client = [], Client()
    for _ in range(limit):
        observations.append(asyncio.run(observe(module, client, url, Deadline.after(timeout))))
        verdict = judge(observations)
        if until(verdict):
            return observations, verdict
        time.sleep(interval)
    raise AssertionError(f"after {limit} readings: {verdict.state}: {verdict.reason}")


def test_busy_worker_is_busy_unverified_and_never_probed(fleet):
    worker = fleet.workers[0]
    offset = worker.log_size()
    load = Load(worker.url, max_new_tokens=4000)
    wait_until(lambda: fleet.queue_length(worker) >= 1, 30, "the worker has the generation queued")
    observations, client = [], Client()
    for _ in range(4):  # more readings, further apart, than "hung" would ever need
        observations.append(asyncio.run(observe("fastchat_worker", client, worker.url, Deadline.after(TIMEOUT))))
        verdict = judge(observations)
        assert verdict.state == "busy" and "unverified" in verdict.reason, verdict.reason
        time.sleep(INTERVAL)
    assert fleet.queue_length(worker) >= 1, "the load finished too early to prove anything"
    assert not any(o.probe for o in observations)
    result = check(worker.url, module="fastchat_worker", interval=INTERVAL, timeout=TIMEOUT)
    assert (result.verdict.state, result.probe_sent, result.exit_code) == ("busy", False, 0)
    assert not PROBE_LINE.search(worker.log_since(offset)), "a busy worker was sent a generation request"
    assert load.cancel() is None


def test_idle_worker_answers_its_one_token_probe(fleet):
    worker = fleet.workers[1]
    offset = worker.log_size()
    result = check(worker.url, module="fastchat_worker", interval=INTERVAL, timeout=5)
    assert result.verdict.state == "idle", result.verdict.reason
    assert result.probe_sent and "answered" in result.verdict.reason
    assert result.last_reading.models == (MODEL_NAME,)
    assert len(PROBE_LINE.findall(worker.log_since(offset))) == 1


def test_frozen_worker_is_hung_within_two_intervals(fleet):
    worker = fleet.workers[1]
    worker.freeze()
    try:
        frozen_at = time.monotonic()
        observations, verdict = observe_every(worker.url, "fastchat_worker", lambda v: v.state == "hung")
        assert len(observations) == 2
        assert time.monotonic() - frozen_at <= 2 * INTERVAL + 2 * TIMEOUT + 0.5
        assert all(o.status == "timeout" for o in observations)  # accepted, never answered
        assert "wedged" in verdict.reason
    finally:
        worker.thaw()
    _, verdict = observe_every(worker.url, "fastchat_worker", lambda v: v.state == "idle", timeout=5)


def test_killed_worker_is_down(fleet):
    extra = fleet.start_worker()
    extra.process.kill()
    extra.process.wait(10)
    result = check(extra.url, module="fastchat_worker", interval=INTERVAL, timeout=TIMEOUT)
    assert result.verdict.state == "down"
    assert "connection refused" in result.verdict.reason
    assert result.exit_code == 2
    fleet.workers.remove(extra)
    fleet.wait_forgotten(extra.url)  # the fleet as it was: the next test reads the controller's table


def test_controller_and_api_checks_leave_dispatch_and_registration_unchanged(fleet):
    """At least 300 checks each (75 minutes of 15-second checks) of the controller and the
    API server, over at least two worker heartbeats: every check asks the same two
    side-effect-free endpoints, so a few hundred prove what a day's 5,760 would."""
    client = Client()
    models_before = fleet.registered_models()
    controller_offset = fleet.controller.log_size()
    worker_offsets = [w.log_size() for w in fleet.workers]
    api_offset = fleet.api.log_size()
    started, checks = time.monotonic(), 0
    while checks < 300 or time.monotonic() - started < 2 * HEARTBEAT_INTERVAL + 1:
        c = asyncio.run(fastchat.observe_controller(client, fleet.controller.url, Deadline.after(5)))
        a = asyncio.run(fastchat.observe_api(client, fleet.api.url, Deadline.after(5)))
        assert c.status == a.status == "ok", (c.error, a.error)
        assert c.listed_models == a.listed_models == (MODEL_NAME,)
        checks += 1
    elapsed = time.monotonic() - started
    controller_log = fleet.controller.log_since(controller_offset)
    # The controller was asked only these, and never dispatched, registered or dropped anything.
    asked = set(re.findall(r'"((?:GET|POST) /\S*) HTTP', controller_log))
    assert asked <= {"GET /test_connection", "POST /list_models", "POST /receive_heart_beat"}, asked
    assert len(re.findall(r'"GET /test_connection HTTP', controller_log)) == checks
    # The API server asks the controller /list_models once per check.
    assert len(re.findall(r'"POST /list_models HTTP', controller_log)) == 2 * checks
    for forbidden in ("names:", "Register", "Remove stale", "unknown heart beat", "no worker", "Get status fails"):
        assert forbidden not in controller_log, forbidden
    # Every worker kept sending known heartbeats: still registered, never dropped.
    for worker in fleet.workers:
        assert f"Receive heart beat. {worker.url}" in controller_log
    # No worker was sent anything (a heartbeat is sent by the worker, not to it).
    for worker, offset in zip(fleet.workers, worker_offsets):
        assert not re.search(r'"(?:GET|POST) /', worker.log_since(offset)), worker.role
    api_asked = set(re.findall(r'"((?:GET|POST) /\S*) HTTP', fleet.api.log_since(api_offset)))
    assert api_asked == {"POST /v1/chat/completions"}
    assert fleet.registered_models() == models_before
    # The dispatch state afterwards: every queue count at 0 (the first dispatch, made here on
    # purpose and after the measurement, logs the controller's queue counts).
    answer = requests.post(fleet.controller.url + "/get_worker_address", json={"model": MODEL_NAME}, timeout=5)
    assert answer.json()["address"] in {w.url for w in fleet.workers}
    line = wait_until(lambda: re.search(r"names: .*queue_lens: \[([^\]]*)\]",
                                        fleet.controller.log_since(controller_offset)), 5, "the controller logs its dispatch")
    assert [float(q) for q in line.group(1).split(",")] == [0.0] * len(fleet.workers)
    print(f"{checks} controller + {checks} API checks in {elapsed:.1f}s")


def test_the_endpoints_hangwatch_avoids_do_change_the_fleet(fleet):
    """Why the modules stay away from them (docs/fleets.md): measured, not assumed."""
    offset = fleet.controller.log_size()
    # The API server's /v1/models makes the controller re-register every worker.
    assert requests.get(fleet.api.url + "/v1/models", timeout=10).ok
    # (refresh_all_workers empties the table and registers each worker anew, asking each one's
    # /worker_get_status inside the controller's request loop: 5 s stalls per hung worker).
    log = wait_until(lambda: (lambda text: text if text.count("Register done") >= 2 else None)(
        fleet.controller.log_since(offset)), 10, "re-registration")
    assert log.count("Register a new worker") >= 2
    # The controller's /get_worker_address adds 1 to the chosen worker's queue.
    offset = fleet.controller.log_size()
    for _ in range(3):
        requests.post(fleet.controller.url + "/get_worker_address", json={"model": MODEL_NAME}, timeout=5)
    queues = re.findall(r"queue_lens: \[([^\]]*)\]", fleet.controller.log_since(offset))
    totals = [sum(float(q) for q in line.split(",")) for line in queues]
    assert totals[-1] > totals[0], totals  # counted as load until the next heartbeat

