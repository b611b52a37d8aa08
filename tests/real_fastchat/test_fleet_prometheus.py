"""A FastChat deployment and a vLLM box in one Prometheus config (examples/fleet/prometheus.yml),
through the real exporter, Prometheus with the shipped rules, and Alertmanager.

Every member's state is on the dashboard's series; a busy worker is busy (never probed, never
hung, no alert) and the shortest-queue pick moves away from it; a frozen worker is hung,
unroutable and raises the one restart alert with its target and container; the controller
and API server stay idle, and the controller never dispatched anything while watched.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from hangwatch.demo.chain import HUNG
from hangwatch.demo.wait import wait_for_seconds, wait_until
from hangwatch.simulator import Simulator
from tests.real_fastchat.fleet import SCRAPE, fleet_stack
from tests.real_fastchat.test_fastchat_checks import PROBE_LINE, Load
from tests.support.require import require_binary

pytestmark = pytest.mark.real

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fleets.md"


def panel_queries() -> list[str]:
    """The fleet panel's PromQL, as docs/fleets.md gives it to the dashboard."""
    block = re.search(r"```promql\n(.*?)```", DOCS.read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
MEMBERS = ("vllm-a", "fc-worker-0", "fc-worker-1", "fc-controller", "fc-api")


@pytest.fixture
def stack(fleet, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    sim = Simulator()
    sim.start(port=0)
    stack = fleet_stack(tmp_path, fleet, sim.url)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()
        sim.stop()


def test_one_config_shows_every_member_and_never_hurts_a_busy_worker(stack, fleet):
    controller_offset = fleet.controller.log_size()
    stack.wait_states({name: "idle" for name in MEMBERS}, timeout=90)
    engines = {s["metric"]["target"]: (s["metric"].get("engine", ""), s["metric"]["module"])
               for s in stack.query("hangwatch_backend_info")}
    assert engines["fc-worker-0"] == ("fastchat", "fastchat_worker")
    assert engines["fc-controller"] == ("", "fastchat_controller")
    wait_until(lambda: stack.by_target("target:hangwatch_dispatch_unroutable:bool") == {
        "vllm-a": 0, "fc-worker-0": 0, "fc-worker-1": 0}, 10, "dispatch series for the three members", interval=0.2)
    assert stack.by_target("hangwatch_fleet_models_registered") == {"fc-controller": 1, "fc-api": 1}
    # Every query of the dashboard's fleet panel returns data on these real series.
    queries = panel_queries()
    assert len(queries) == 9
    for expr in queries:
        wait_until(lambda: stack.query(expr), 30, f"data for the panel query {expr}", interval=0.5)
    assert {s["metric"]["target"] for s in stack.query(queries[0])} == set(MEMBERS)

    # Busy: a long generation on worker 0 for several scrapes.
    worker = fleet.workers[0]
    busy_from = time.monotonic()
    loads = [Load(worker.url, max_new_tokens=8000) for _ in range(2)]  # queue 2, for well over 4 scrapes
    stack.wait_states({"fc-worker-0": "busy"}, timeout=30)
    # A probe the exporter sent while the worker was still idle (just before the load queued)
    # is allowed and may log a moment later: the log is read from one scrape after "busy".
    wait_for_seconds(SCRAPE, "one scrape after busy", check=stack.check_alive)
    offset = worker.log_size()
    wait_until(lambda: stack.by_target("target:hangwatch_shortest_queue_pick:bool").get("fc-worker-1") == 1
               and stack.by_target("target:hangwatch_shortest_queue_pick:bool").get("fc-worker-0") == 0,
               20, "the shortest-queue pick moves to the idle worker", interval=0.2)
    wait_until(lambda: time.monotonic() - busy_from > 4 * SCRAPE, 60, "four scrapes of the busy worker")
    busy_log = worker.log_since(offset)  # read while the worker is still busy
    assert fleet.queue_length(worker) >= 1, "the load ended too early to prove anything"
    assert stack.states()["fc-worker-0"] == "busy"
    busy_until = time.time()
    # "Never hung" holds only once the rules judged the busy span's last readings.
    stack.wait_judged(busy_until, "fc-worker-0")
    for load in loads:
        assert load.cancel() is None
    # Never probed while busy (the worker's own access log), never hung, never alerted.
    assert not PROBE_LINE.search(busy_log), "a busy worker was sent a probe"
    assert not stack.ever_state("fc-worker-0", "hung", time.monotonic() - busy_from + 5)
    assert not stack.receiver.alerts("/alerts") and not stack.receiver.alerts("/people")
    # Watching the fleet never made its controller dispatch or re-register anything.
    controller_log = fleet.controller.log_since(controller_offset)
    assert "names:" not in controller_log and "Register" not in controller_log


def test_frozen_worker_is_hung_unroutable_and_raises_the_one_restart_alert(stack, fleet):
    stack.wait_states({name: "idle" for name in MEMBERS}, timeout=90)
    worker = fleet.workers[1]
    worker.freeze()
    try:
        frozen_at = time.monotonic()
        stack.wait_states({"fc-worker-1": "hung"}, timeout=6 * SCRAPE)
        hung_after = time.monotonic() - frozen_at
        assert hung_after <= 3 * SCRAPE + 3, f"hung after {hung_after:.1f}s (two intervals + a rule evaluation)"
        assert stack.by_target("target:hangwatch_dispatch_unroutable:bool")["fc-worker-1"] == 1
        assert "fc-worker-1" not in stack.by_target("target:hangwatch_shortest_queue_pick:bool")
        alerts = wait_until(lambda: stack.receiver.alerts("/alerts", HUNG), 20, "the hang alert at the webhook route")
        labels = alerts[0][1]["labels"]
        assert (labels["target"], labels["container"], labels["action"]) == ("fc-worker-1", "fc-worker-1", "restart")
        assert {a["labels"]["target"] for _, a in stack.receiver.alerts("/alerts")} == {"fc-worker-1"}
        states = stack.states()
        assert (states["fc-controller"], states["fc-api"], states["fc-worker-0"]) == ("idle", "idle", "idle")
    finally:
        worker.thaw()
    stack.wait_states({"fc-worker-1": "idle"}, timeout=60)


def test_a_worker_serving_a_model_its_controller_does_not_list_is_a_warning(fleet, tmp_path):
    """A worker that serves but never reaches its controller (here: --no-register)."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    stray = fleet.start_worker(model_name="other", register=False)
    sim = Simulator()
    sim.start(port=0)
    extra = [{"targets": [stray.url], "labels": {"target": "fc-worker-2", "container": "fc-worker-2",
                                                 "fleet": "fastchat", "__param_module": "fastchat_worker"}}]
    stack = fleet_stack(tmp_path, fleet, sim.url, extra_targets=extra)
    try:
        stack.start()
        stack.wait_states({"fc-worker-2": "idle", "fc-controller": "idle"}, timeout=90)
        dropped = wait_until(lambda: stack.receiver.alerts("/people", "HangwatchFleetMemberDropped"), 90,
                             "the dropped-member warning for people")
        labels = dropped[0][1]["labels"]
        assert (labels["target"], labels["model"], labels["severity"]) == ("fc-worker-2", "other", "warning")
        assert "action" not in labels
        assert {a["labels"]["target"] for _, a in stack.receiver.alerts("/people", "HangwatchFleetMemberDropped")} \
            == {"fc-worker-2"}
        assert not stack.receiver.alerts("/alerts"), "nothing to restart: the worker is fine"
    finally:
        stack.close()
        sim.stop()
        stray.stop()
        fleet.workers.remove(stray)
