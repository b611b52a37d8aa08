"""The simulator answers like the real vLLM of this session, endpoint by endpoint.

tests/test_simulator.py compares the simulator with captures taken once; this compares it
with the live server, so a drift in either shows up in CI.
"""
import pytest
import requests

from hangwatch.simulator import Simulator
from harness.vllm_server import MODEL_NAME
from tests.test_simulator import _keys as keys  # the JSON key paths the capture tests compare

pytestmark = pytest.mark.real


@pytest.fixture
def sim():
    simulator = Simulator(model=MODEL_NAME).start()
    yield simulator
    simulator.stop()


@pytest.mark.parametrize("path, body", [
    ("/v1/models", None),
    ("/v1/completions", {"prompt": "hello world", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}),
])
def test_json_answers_have_the_same_keys(vllm, sim, path, body):
    def ask(base):
        if body is None:
            return requests.get(base + path, timeout=30)
        return requests.post(base + path, json={"model": MODEL_NAME, "temperature": 0, **body}, timeout=60)
    real, fake = ask(vllm.url), ask(sim.url)
    assert (real.status_code, fake.status_code) == (200, 200), real.text[:300]
    assert keys(fake.json()) == keys(real.json())
    assert fake.headers["content-type"].split(";")[0] == real.headers["content-type"].split(";")[0]


def test_metrics_content_type_and_families_match(vllm, sim):
    from prometheus_client.parser import text_string_to_metric_families
    real, fake = requests.get(vllm.url + "/metrics", timeout=30), requests.get(sim.url + "/metrics", timeout=30)
    assert real.headers["content-type"] == fake.headers["content-type"]

    def families(text):
        return {(f.name, f.type) for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    assert families(fake.text) == families(real.text)
