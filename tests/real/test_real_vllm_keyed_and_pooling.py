"""Real vLLM 0.32 the way shared deployments start it: with ``--api-key``, and serving an embedding model.

Before issue 10, both were called hung when idle — a keyed vLLM answers every ``/v1/*``
call without its key with 401, a pooling model has no completions route (404) — and the
webhook would have restarted a healthy server, up to its budget, every budget window.

Each configuration is its own vLLM process for this module (the tiny random Llama); the
proof that hangwatch sends exactly one request at idle and none while busy comes from vLLM's
own counters (``http_requests_total{handler}`` and ``vllm:request_success_total``).
"""
import json
import threading

import pytest
import requests

from hangwatch.demo.files import private_file
from harness.vllm_server import MODEL_NAME, VLLMServer, venv_path, venv_usable
from tests.exporter.test_probe_endpoint import samples
from tests.real.test_real_vllm_verdicts import both_counted
from tests.real.test_real_vllm_verdicts import hangwatch_check as run_check
from tests.real.test_real_vllm_verdicts import inference_requests as served
from tests.support.require import require

pytestmark = pytest.mark.real

KEY = "sk-hangwatch-real-0123456789abcdef"
RUNNING = "vllm:num_requests_running"


def started(extra_args):
    require(venv_usable(), f"vLLM venv at {venv_path()} (make it with .ci/setup-vllm.sh)")
    server = VLLMServer(extra_args=extra_args)
    server.start()
    return server


@pytest.fixture(scope="module")
def keyed():
    server = started(["--api-key", KEY])
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def pooling():
    server = started(["--runner", "pooling", "--convert", "embed"])
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def key_file(tmp_path):
    path = private_file(tmp_path / "vllm-key", KEY + "\n")
    return str(path)


def hangwatch_check(url, *args):
    """`hangwatch check --json` as a user runs it; the key never appears in what it prints."""
    result = run_check(url, *args)
    assert KEY not in json.dumps(result)
    return result


def counted(server, handler, before, what) -> float:
    """vLLM's counts of requests on ``handler`` (HTTP answers plus engine successes) once BOTH have
    moved past the page ``before`` (it counts a request as it ends, in each counter on its own)."""
    return served(both_counted(server, before, handler, what), handler)


# -- --api-key ------------------------------------------------------------------------------------

def test_keyed_vllm_keeps_metrics_open_and_refuses_the_api_without_the_key(keyed):
    assert requests.get(keyed.url + "/metrics", timeout=5).status_code == 200
    assert requests.get(keyed.url + "/v1/models", timeout=5).status_code == 401
    headers = {"Authorization": f"Bearer {KEY}"}
    assert requests.get(keyed.url + "/v1/models", headers=headers, timeout=5).status_code == 200


def test_keyed_idle_server_with_the_key_is_idle_after_exactly_one_probe(keyed, key_file):
    keyed.wait_idle(60)
    before = keyed.metrics()
    result = hangwatch_check(keyed.url, "--interval", "1", "--api-key-file", key_file)
    assert (result["verdict"], result["exit_code"], result["probe_sent"]) == ("idle", 0, True), result["reason"]
    assert result["probe"]["outcome"] == "answered" and result["probe"]["kind"] == "completion"
    assert counted(keyed, "/v1/completions", before, "the probe counted") == \
        served(before, "/v1/completions") + 2  # one request


def test_keyed_idle_server_without_the_key_is_never_hung_and_says_why(keyed):
    keyed.wait_idle(60)
    for _ in range(3):  # "failed twice in a row" was the old false hang
        result = hangwatch_check(keyed.url, "--interval", "1")
        assert (result["verdict"], result["exit_code"]) == ("idle", 0), result["reason"]
        assert result["probe"]["outcome"] == "rejected" and result["probe"]["http_status"] == 401
        assert "API key" in result["reason"]


def test_keyed_server_without_the_key_is_exported_as_rejected_not_failed(keyed, exporters):
    keyed.wait_idle(60)
    _, url = exporters()
    answer = requests.get(url + "/probe", params={"target": keyed.url}, timeout=30)
    got = samples(answer.text)
    assert got[("hangwatch_probe_rejected", ())] == 1
    assert got[("hangwatch_probe_failed", ())] == 0
    assert got[("hangwatch_up", ())] == 1 and got[("hangwatch_requests_in_flight", ())] == 0


def test_keyed_server_frozen_at_idle_is_hung_with_the_key(keyed, key_file):
    keyed.wait_idle(60)
    try:
        keyed.freeze()
        result = hangwatch_check(keyed.url, "--interval", "1", "--timeout", "3", "--api-key-file", key_file)
    finally:
        keyed.thaw()
    assert (result["verdict"], result["exit_code"]) == ("hung", 1), result["reason"]
    assert "probe failed 2 times" in result["reason"]
    keyed.prove_healthy()  # serving again: the first pages after a thaw are the ones from before the freeze


def test_keyed_server_frozen_at_idle_without_the_key_is_not_restartable(keyed):
    """Without the key hangwatch cannot see an idle hang (HangwatchProbeRejected tells people)."""
    keyed.wait_idle(60)
    try:
        keyed.freeze()
        result = hangwatch_check(keyed.url, "--interval", "1", "--timeout", "3")
    finally:
        keyed.thaw()
    assert (result["verdict"], result["exit_code"]) == ("idle", 0), result["reason"]
    assert result["probe"]["outcome"] == "rejected"


# -- an embedding model (--runner pooling --convert embed) ----------------------------------------

def test_pooling_server_has_no_completions_route(pooling):
    answer = requests.post(pooling.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 1},
                           timeout=10)
    assert answer.status_code == 404  # the fact the auto probe relies on


def test_pooling_idle_server_is_idle_via_one_embedding(pooling):
    pooling.wait_idle(60)
    before = pooling.metrics()
    result = hangwatch_check(pooling.url, "--interval", "1")
    assert (result["verdict"], result["exit_code"]) == ("idle", 0), result["reason"]
    assert result["probe"]["kind"] == "embedding" and result["probe"]["outcome"] == "answered"
    assert counted(pooling, "/v1/embeddings", before, "the embedding probe counted") == \
        served(before, "/v1/embeddings") + 2


def test_pooling_server_busy_with_long_embeddings_is_never_hung(pooling):
    stop, errors = threading.Event(), []

    def embed():
        session = requests.Session()
        while not stop.is_set():
            try:
                answer = session.post(pooling.url + "/v1/embeddings",
                                      json={"model": MODEL_NAME, "input": "hello world " * 15000}, timeout=120)
                if answer.status_code != 200:
                    errors.append(answer.status_code)
            except requests.RequestException as exc:
                errors.append(str(exc))

    workers = [threading.Thread(target=embed, daemon=True) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        pooling.wait_until(lambda p: (p.value(RUNNING) or 0) >= 1, 60, what="a long embedding running")
        results = [hangwatch_check(pooling.url, "--interval", "1") for _ in range(4)]
    finally:
        stop.set()
        for worker in workers:
            worker.join(150)
    assert not errors, errors
    for result in results:
        assert result["verdict"] in ("busy", "idle") and result["exit_code"] == 0, result["reason"]
    assert any(r["verdict"] == "busy" for r in results), [r["reason"] for r in results]


def test_pooling_server_frozen_at_idle_is_hung(pooling):
    pooling.wait_idle(60)
    try:
        pooling.freeze()
        result = hangwatch_check(pooling.url, "--interval", "1", "--timeout", "3")
    finally:
        pooling.thaw()
    assert (result["verdict"], result["exit_code"]) == ("hung", 1), result["reason"]
    assert "probe failed 2 times" in result["reason"]
    pooling.wait_idle(60)
