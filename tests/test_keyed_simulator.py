"""A vLLM started with ``--api-key``, as the simulator serves it (measured on vLLM 0.32: /metrics
open, every /v1/* call without the key 401): idle without the key is never hung, with the key the
idle engine is verified, and a frozen engine is found hung only when hangwatch has the key.

The simulator counts the inference requests it *served*, so "the probe reached the engine" is
proven from the server's side.
"""
import subprocess
import sys

import pytest
import requests

from hangwatch.check import check
from hangwatch.simulator import Simulator
from tests.exporter.test_probe_endpoint import samples

KEY = "sk-sim-0123456789abcdef0123"


@pytest.fixture
def keyed():
    simulator = Simulator(api_key=KEY).start()
    yield simulator
    simulator.stop()


def test_the_simulator_refuses_the_api_without_the_key_as_vllm_does(keyed):
    assert requests.get(keyed.url + "/metrics", timeout=5).status_code == 200
    assert requests.get(keyed.url + "/v1/models", timeout=5).status_code == 401
    assert requests.get(keyed.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=5).status_code == 200


def test_idle_without_the_key_is_idle_and_never_reaches_the_engine(keyed):
    for _ in range(3):
        result = check(keyed.url, interval=0.2, timeout=2)
        assert (result.verdict.state, result.exit_code) == ("idle", 0)
        assert result.last_probe.rejected and result.last_probe.http_status == 401
    assert keyed.inference_requests == 0


def test_idle_with_the_key_is_verified_by_exactly_one_probe(keyed):
    result = check(keyed.url, interval=0.2, timeout=2, api_key=KEY)
    assert (result.verdict.state, result.last_probe.outcome) == ("idle", "answered")
    assert keyed.inference_requests == 1


def test_frozen_at_idle_is_hung_with_the_key_and_not_without(keyed):
    keyed.set_state("frozen_idle")
    try:
        with_key = check(keyed.url, interval=0.2, timeout=1, api_key=KEY)
        without = check(keyed.url, interval=0.2, timeout=1)
    finally:
        keyed.set_state("idle")
    assert (with_key.verdict.state, with_key.exit_code) == ("hung", 1)
    assert (without.verdict.state, without.exit_code) == ("idle", 0)


def test_the_exporters_default_key_reaches_the_probe(keyed, tmp_path, exporters):
    from hangwatch.exporter.config import exporter_config
    (tmp_path / "key").write_text(KEY)
    _, url = exporters(exporter_config({"api_key_file": str(tmp_path / "key"), "allow_targets": [keyed.url]}))
    got = samples(requests.get(url + "/probe", params={"target": keyed.url}, timeout=10).text)
    assert got[("hangwatch_probe_success", ())] == 1 and got[("hangwatch_probe_rejected", ())] == 0
    assert keyed.inference_requests == 1


def test_simulate_serves_a_key_from_a_file(tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    process = subprocess.Popen([sys.executable, "-m", "hangwatch", "simulate", "--listen", "127.0.0.1:0",
                                "--api-key-file", str(tmp_path / "key")], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        assert requests.get(url + "/v1/models", timeout=5).status_code == 401
        assert requests.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).ok
    finally:
        process.terminate()
        process.wait(10)
