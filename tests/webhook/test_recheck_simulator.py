"""The webhook's re-check is the real ``hangwatch.check.check`` against the vLLM simulator.

The rest of the fast webhook tier answers the re-check with ``FakeRechecker``, which copies
``check()``'s keyword signature: a renamed keyword, a changed verdict or a probe sent at the
wrong moment would pass there. Here nothing stands between the webhook and a real server but
Docker (a fake restarter that records restarts): the alert is judged by ``check()`` reading
real pages over real sockets, and the simulator sees what the re-check did.
"""
from __future__ import annotations

import json

import pytest

from hangwatch.demo.files import private_file
from hangwatch.simulator import Simulator
from hangwatch.webhook.app import create_app

from .conftest import make_config
from .fakes import TOKEN, FakeClock, FakeRestarter, alert, iso, payload


@pytest.fixture
def sim():
    simulator = Simulator(api_key="sim-key-0123456789").start()
    yield simulator
    simulator.stop()


@pytest.fixture
def webhook(tmp_path, sim):
    """An app whose re-checker is the default (``check``): only Docker is faked."""
    key = private_file(tmp_path / "api-key", "sim-key-0123456789\n")
    clock = FakeClock()
    restarter = FakeRestarter(clock, names=["vllm-a"])
    config = make_config(tmp_path / "state", recheck={"interval": "0.3s", "timeout": "1s"}, targets=[
        {"name": "vllm-a", "container": "vllm-a", "url": sim.url, "api_key_file": str(key)}])
    app = create_app(config, token=TOKEN, restarter=restarter, clock=clock)
    state = app.extensions["hangwatch"]

    def post_and_settle():
        answer = app.test_client().post("/alerts", json=payload(alert(starts_at=iso(clock() - 60))),
                                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200, answer.get_data(as_text=True)
        assert state.wait_idle(20), "the re-check did not finish"
        with open(tmp_path / "state" / "ledger.jsonl") as handle:
            decided = [r for r in map(json.loads, handle) if r["event"] == "decision"]
        webhook.last = decided
        return [(d["action"], d["reason"]) for d in decided], restarter.restarts

    webhook = post_and_settle
    yield post_and_settle
    state.wait_idle(20)
    state.close()


def test_a_frozen_engine_with_work_in_flight_is_restarted(sim, webhook):
    sim.set_state("busy", n=2)
    assert sim.wait_for(lambda: sim.running == 2)
    sim.freeze()
    probes_before = sim.inference_requests
    decided, restarts = webhook()
    assert decided == [("restart", "hung")] and restarts == [("vllm-a", 30.0)]
    assert sim.inference_requests == probes_before  # work in flight: never probed


def test_an_engine_making_progress_is_not_restarted(sim, webhook):
    sim.set_state("busy", n=2)
    assert sim.wait_for(lambda: sim.running == 2)
    decided, restarts = webhook()
    assert decided == [("skip", "recheck_busy")] and restarts == []


def test_an_idle_engine_is_probed_with_its_key_and_not_restarted(sim, webhook):
    decided, restarts = webhook()
    assert decided == [("skip", "recheck_idle")] and restarts == []
    assert sim.inference_requests >= 1  # the probe reached the engine
    detail = webhook.last[0]["detail"]  # what the ledger tells a person
    assert "answered" in detail and "rejected" not in detail, detail  # with the target's key: else 401


def test_a_down_engine_is_not_restarted(sim, webhook):
    """Refused is down (perhaps loading weights), never hung: only hung restarts."""
    sim.set_state("dead")
    decided, restarts = webhook()
    assert decided == [("skip", "recheck_down")] and restarts == []


def test_an_asleep_engine_is_never_probed_nor_restarted(sim, webhook):
    sim.set_state("asleep")
    decided, restarts = webhook()
    assert restarts == [] and decided[0][0] == "skip"
    assert sim.inference_requests == 0
