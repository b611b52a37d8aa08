"""`hangwatch check` against the vLLM simulator in each state of the truth table.

The simulator emits what real vLLM 0.32 emits (checked against real captures in
tests/test_simulator.py) and counts every inference request it receives, so "no probe
while busy" is proven from the server's side, not from hangwatch's own bookkeeping.
"""
import json
import subprocess
import sys
import threading

import pytest

from hangwatch.check import check
from hangwatch.simulator import Simulator


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


def judged(sim, **kw):
    kw.setdefault("interval", 0.4)
    kw.setdefault("timeout", 2.0)
    return check(sim.url, **kw)


def test_idle_server_is_idle_after_one_tiny_probe(sim):
    result = judged(sim)
    assert (result.verdict.state, result.exit_code, result.probe_sent) == ("idle", 0, True)
    assert sim.inference_requests == 1


@pytest.mark.parametrize("state, params", [
    ("busy", {"n": 4}),
    ("saturated", {}),
    ("long_prefill", {"prompt_tokens": 24000}),
])
def test_loaded_server_is_busy_and_never_probed(sim, state, params):
    sim.set_state(state, **params)
    assert sim.wait_for(lambda: sim.running > 0)
    before = sim.inference_requests
    result = judged(sim)
    assert (result.verdict.state, result.exit_code) == ("busy", 0), result.verdict.reason
    assert not result.probe_sent
    assert sim.inference_requests == before


def test_long_prefill_moves_only_kv_and_is_not_hung(sim):
    sim.set_state("long_prefill", prompt_tokens=30000)
    assert sim.wait_for(lambda: sim.running == 1)
    result = judged(sim, interval=0.3)
    assert result.verdict.state == "busy"
    assert "kv_cache_usage" in result.verdict.reason
    assert "generation_tokens" not in result.verdict.reason


def test_frozen_engine_with_work_in_flight_is_hung_without_a_probe(sim):
    sim.set_state("busy", n=3)
    assert sim.wait_for(lambda: sim.running == 3)
    sim.freeze()
    before = sim.inference_requests
    result = judged(sim)
    assert (result.verdict.state, result.exit_code) == ("hung", 1)
    assert len(result.observations) == 3 and not result.probe_sent
    assert sim.inference_requests == before


def test_frozen_idle_engine_is_hung_by_two_failed_probes(sim):
    sim.set_state("frozen_idle")
    result = judged(sim, timeout=0.5)
    assert (result.verdict.state, result.exit_code) == ("hung", 1)
    assert "probe failed 2 times" in result.verdict.reason


def test_thawed_engine_is_healthy_again(sim):
    sim.set_state("busy", n=2)
    assert sim.wait_for(lambda: sim.running == 2)
    sim.freeze()
    assert judged(sim).verdict.state == "hung"
    sim.thaw()
    assert judged(sim).verdict.state == "busy"


def test_restart_between_readings_is_restarted_not_hung(sim):
    sim.set_state("busy", n=2)
    assert sim.wait_for(lambda: sim.running == 2)
    sim.freeze()
    restarted = threading.Event()

    def restart_after_first_reading(observation, verdict):
        if not restarted.is_set():
            sim.restart()
            restarted.set()

    result = check(sim.url, interval=0.3, timeout=2, on_observation=restart_after_first_reading)
    assert result.verdict.state == "restarted", result.verdict.reason
    assert result.exit_code == 0


@pytest.mark.parametrize("state, verdict", [("metrics_missing", "blind"), ("metrics_garbage", "blind"),
                                            ("dead", "down"), ("unresponsive", "hung")])
def test_broken_server_states(sim, state, verdict):
    sim.set_state(state)
    result = judged(sim, timeout=0.5)
    assert result.verdict.state == verdict, result.verdict.reason
    assert not result.probe_sent


def test_asleep_engine_is_idle_and_not_probed(sim):
    sim.set_state("asleep")
    result = judged(sim)
    assert result.verdict.state == "idle" and not result.probe_sent


def test_command_line_on_a_busy_simulator(sim):
    sim.set_state("busy", n=4)
    assert sim.wait_for(lambda: sim.running == 4)
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", sim.url, "--json", "--interval", "0.4"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["verdict"] == "busy" and data["in_flight"] == 4 and data["probe_sent"] is False
    assert data["engine"] == "vllm" and data["module"] == "backend"
