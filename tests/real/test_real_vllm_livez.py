"""The exporter's /livez and /readyz — a kubelet's probes — on a real vLLM 0.32.

The exporter runs with its defaults (readings 2 s apart, 2 s per request, every answer within
the 9 s budget), the settings docs/kubernetes.md recommends with ``timeoutSeconds: 10``. What a
kubelet relies on, proven here on the real server:

- busy generations and a long chunked prefill answer 200 on every call, and vLLM's own
  counters show no request from hangwatch while anything is in flight;
- a SIGSTOPped EngineCore answers 503 within one call (with work in flight, and idle);
- a port closed while vLLM loads (a real start-up) answers 200 to /livez on every call and 503
  to /readyz until the server takes work.

Every call's latency is printed (``-s``) and checked against the budget.
"""
import threading
import time

import pytest
import requests

from hangwatch.demo.chain import hangwatch_command
from hangwatch.demo.processes import start_server
from hangwatch.exporter.config import ExporterConfig
from harness.vllm_server import LONG_PROMPT_TOKENS
from tests.real.test_real_vllm_verdicts import RUNNING, inference_requests

pytestmark = pytest.mark.real

CONFIG = ExporterConfig()  # the defaults the manifests use
BUDGET = CONFIG.liveness_budget
PROBE_TIMEOUT = 10  # the kubelet's timeoutSeconds in deploy/kubernetes


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    """``hangwatch exporter`` with no config (the defaults) as its own process, as a pod runs
    it: in this process it would share one GIL with the tests' streaming clients, and a
    2 s reading took 5 s of wall clock there (measured), which no deployment would see."""
    log = tmp_path_factory.mktemp("livez") / "exporter.log"
    process = start_server("exporter", [*hangwatch_command(), "exporter", "--listen", "127.0.0.1:0"], log, "/metrics")
    yield process.url
    process.stop()


def ask(exporter, endpoint, target, show=True):
    """(HTTP code, JSON body, seconds): one kubelet-like call, held to the kubelet's timeout."""
    started = time.monotonic()
    answer = requests.get(f"{exporter}/{endpoint}", params={"target": target}, timeout=PROBE_TIMEOUT)
    seconds = time.monotonic() - started
    body = answer.json()
    if show:
        print(f"{endpoint} {answer.status_code} {seconds:.2f}s verdict={body.get('verdict')} "
              f"readings={body.get('readings')} probe_sent={body.get('probe_sent')}: {body['why'][:100]}")
    assert seconds < BUDGET + 0.5, f"{endpoint} took {seconds:.2f}s, over the {BUDGET:g}s budget"
    return answer.status_code, body, seconds


def test_busy_generations_are_live_and_ready_on_every_call_and_never_probed(vllm, exporter):
    with vllm.generations(4, max_tokens=20000, deadline_s=120) as load:
        before = vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        answers = [ask(exporter, endpoint, vllm.url) for endpoint in ("livez", "readyz") * 3]
        after = vllm.metrics()
        assert after.value(RUNNING) == 4, "a generation ended early: the proof below needs all 4 streaming"
        assert not load.errors(), load.errors()
    for code, body, _ in answers:
        assert (code, body["verdict"], body["probe_sent"]) == (200, "busy", False), body["why"]
    assert inference_requests(after) == inference_requests(before), "hangwatch sent an inference request"


def test_long_chunked_prefill_is_live_on_every_call(vllm, exporter):
    generation = vllm.long_prompt(LONG_PROMPT_TOKENS, max_tokens=4, deadline_s=180)
    inside = []
    try:
        vllm.wait_until(lambda p: p.value(RUNNING) == 1, 60, what="the long prompt running")
        deadline = time.monotonic() + 150
        while generation.first_token_at is None and generation.running and time.monotonic() < deadline:
            started = time.monotonic()
            code, body, seconds = ask(exporter, "livez", vllm.url)
            assert code == 200, body["why"]  # every call, inside the prefill or not
            if generation.first_token_at is None or generation.first_token_at > started + seconds:
                inside.append(body)
        generation.join(60)
    finally:
        generation.cancel()
    assert generation.error is None, generation.error
    assert inside, "the prefill ended before one whole /livez call fitted inside it"
    for body in inside:
        assert (body["verdict"], body["probe_sent"], body["running"]) == ("busy", False, 1), body["why"]


def test_stopped_engine_core_with_work_in_flight_is_503_within_one_call(vllm, exporter):
    with vllm.generations(4, max_tokens=20000, deadline_s=120) as load:
        vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        try:
            vllm.freeze()
            # The API server flushes what the engine had done before the SIGSTOP for a moment:
            # a call whose first reading lands before that sees progress (busy, 200). "Within one
            # call" counts from a page that no longer moves (as the verdict test judges it).
            still = vllm.wait_frozen(running=4)
            frozen_live = ask(exporter, "livez", vllm.url)
            frozen_ready = ask(exporter, "readyz", vllm.url)
        finally:
            vllm.thaw()
        vllm.wait_progress(still)  # judged once it steps again, not at the instant of SIGCONT
        thawed = ask(exporter, "livez", vllm.url)
        assert not load.errors(), load.errors()
    code, body, _ = frozen_live
    assert (code, body["verdict"], body["probe_sent"], body["readings"]) == (503, "hung", False, 3), body["why"]
    assert frozen_ready[0] == 503
    assert (thawed[0], thawed[1]["verdict"]) == (200, "busy"), thawed[1]["why"]


def test_stopped_idle_engine_core_is_503_within_one_call(vllm, exporter):
    try:
        vllm.freeze()
        code, body, _ = ask(exporter, "livez", vllm.url)
    finally:
        vllm.thaw()
    assert (code, body["verdict"], body["in_flight"]) == (503, "hung", 0), body["why"]
    assert "probe failed 2 times" in body["why"]
    vllm.prove_healthy()  # serving again: the first pages after a thaw are the ones from before the freeze


def test_port_closed_while_loading_is_live_and_not_ready(real_vllm, exporter):
    """A real start-up: SIGTERM, then a new vLLM loading on the same port while /livez and
    /readyz are asked over and over; /livez never says 503."""
    real_vllm.thaw()
    real_vllm.wait_idle(60)
    seen, stop = [], threading.Event()

    def kubelet():
        while not stop.is_set():
            for endpoint in ("livez", "readyz"):
                seen.append((endpoint, *ask(exporter, endpoint, real_vllm.url, show=False)))
            stop.wait(1.0)

    poller = threading.Thread(target=kubelet, daemon=True)
    real_vllm.stop()
    poller.start()
    try:
        real_vllm.start()  # from the main thread: the server dies with the thread that started it
    finally:
        stop.set()
        poller.join(2 * PROBE_TIMEOUT)
    loading = [(endpoint, code, body) for endpoint, code, body, _ in seen if body["verdict"] == "down"]
    slowest = max(seconds for *_, seconds in seen)
    print(f"{len(seen)} calls during the restart, {len(loading)} while the port was closed; slowest {slowest:.2f}s")
    assert len(loading) >= 4, "too few calls landed while the port was closed"
    assert {(endpoint, code) for endpoint, code, _ in loading} == {("livez", 200), ("readyz", 503)}
    assert all(code == 200 for endpoint, code, _, _ in seen if endpoint == "livez")
    assert ask(exporter, "readyz", real_vllm.url)[0] == 200
