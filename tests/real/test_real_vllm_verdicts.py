"""`hangwatch check`, run as a user runs it, on a real vLLM 0.32 in every state.

The proof that hangwatch consumes nothing while the server is busy comes from vLLM's own
counters: the completions endpoint's request counter (prometheus-fastapi-instrumentator's
``http_requests_total{handler="/v1/completions"}``) and ``vllm:request_success_total`` do
not move while hangwatch checks a server whose long generations are still streaming.

The one restart of the package (a restart costs a full start-up) is the last test here; any
test after it gets the restarted server, proven healthy by the ``vllm`` fixture.
"""
import asyncio
import json
import subprocess
import sys
import time

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observe import observe_backend
from hangwatch.verdict import judge
from harness.vllm_server import LONG_PROMPT_TOKENS, Page

pytestmark = pytest.mark.real

RUNNING = "vllm:num_requests_running"


def hangwatch_check(url, *args, timeout_s=120):
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", url, "--json", *args],
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.stdout.count("\n") == 1, (done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert done.returncode == result["exit_code"]
    return result


def counts(page, handler: str = "/v1/completions") -> tuple[float, float]:
    """(requests answered on ``handler``, the engine's successes): vLLM's two counts of a request,
    each incremented on its own (the HTTP one by the API server as the answer goes out)."""
    http = sum(v for (name, labels), v in page.series("http_requests_total").items() if ("handler", handler) in labels)
    return http, page.value("vllm:request_success_total") or 0


def inference_requests(page, handler: str = "/v1/completions") -> float:
    """Requests vLLM has answered, counted by vLLM itself (two independent counters, summed)."""
    return sum(counts(page, handler))


def both_counted(server, before, handler: str = "/v1/completions", what: str = "the request counted") -> Page:
    """The first page on which BOTH of vLLM's counters moved past ``before``'s. Their sum moving is
    no proof: a page where only one had moved yet ends that wait half-way, and a test reading
    "exactly one request" off it then saw half of one."""
    then = counts(before, handler)
    return server.wait_until(lambda p: all(now > was for now, was in zip(counts(p, handler), then)), 15,
                             what=f"{what} (HTTP and engine counters)")


def test_idle_server_is_idle_after_exactly_one_tiny_probe(vllm):
    before = vllm.metrics()
    result = hangwatch_check(vllm.url, "--interval", "1")
    assert (result["verdict"], result["exit_code"], result["probe_sent"]) == ("idle", 0, True)
    assert result["engine"] == "vllm" and result["models"] == ["tiny-llama"]
    after = both_counted(vllm, before, what="the probe counted")
    assert inference_requests(after) == inference_requests(before) + 2  # one request: one http count, one success


def test_four_long_generations_are_busy_and_hangwatch_sends_nothing(vllm):
    with vllm.generations(4, max_tokens=20000, deadline_s=120) as load:
        before = vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        results = [hangwatch_check(vllm.url, "--interval", "1") for _ in range(3)]
        after = vllm.metrics()
        assert after.value(RUNNING) == 4, "a generation ended early: the proof below needs all 4 streaming"
        assert not load.errors(), load.errors()
    for result in results:
        assert (result["verdict"], result["exit_code"]) == ("busy", 0), result["reason"]
        assert result["probe_sent"] is False and result["in_flight"] == 4
    assert inference_requests(after) == inference_requests(before), "hangwatch sent an inference request"


def test_long_chunked_prefill_is_busy_never_hung(vllm):
    assert LONG_PROMPT_TOKENS >= 20000
    generation = vllm.long_prompt(LONG_PROMPT_TOKENS, max_tokens=4, deadline_s=180)
    verdicts = []
    try:
        vllm.wait_until(lambda p: p.value(RUNNING) == 1, 60, what="the long prompt running")
        deadline = time.monotonic() + 150
        while generation.first_token_at is None and generation.running and time.monotonic() < deadline:
            started = time.monotonic()
            result = hangwatch_check(vllm.url, "--interval", "2")
            if generation.first_token_at is None or generation.first_token_at > started + 4.5:
                verdicts.append(result)  # the whole check ran inside the prefill
        generation.join(60)
    finally:
        generation.cancel()
    assert generation.error is None, generation.error
    assert verdicts, "the prefill ended before one whole check fitted inside it"
    for result in verdicts:
        assert (result["verdict"], result["probe_sent"]) == ("busy", False), result["reason"]
        assert result["running"] == 1
    assert any("kv_cache_usage" in r["reason"] for r in verdicts), [r["reason"] for r in verdicts]


def test_stopped_engine_core_is_hung_and_healthy_again_after_cont(vllm):
    with vllm.generations(4, max_tokens=20000, deadline_s=120) as load:
        vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        try:
            vllm.freeze()
            still = vllm.wait_frozen(running=4)  # the API server has flushed what the engine had done
            frozen = hangwatch_check(vllm.url, "--interval", "1")
        finally:
            vllm.thaw()
        vllm.wait_progress(still)
        thawed = hangwatch_check(vllm.url, "--interval", "1")
        assert not load.errors(), load.errors()
    assert (frozen["verdict"], frozen["exit_code"], frozen["probe_sent"]) == ("hung", 1, False), frozen["reason"]
    assert frozen["readings"] == 3
    assert (thawed["verdict"], thawed["exit_code"]) == ("busy", 0), thawed["reason"]


def test_stopped_engine_core_with_nothing_in_flight_fails_its_probe_twice(vllm):
    try:
        vllm.freeze()
        result = hangwatch_check(vllm.url, "--interval", "1", "--timeout", "3")
    finally:
        vllm.thaw()
    assert (result["verdict"], result["exit_code"]) == ("hung", 1), result["reason"]
    assert result["in_flight"] == 0 and "probe failed 2 times" in result["reason"]
    vllm.prove_healthy()  # serving again: the first pages after a thaw are the ones from before the freeze


def test_restart_is_restarted_and_counters_are_not_compared(real_vllm):
    """Runs last: a full stop (SIGTERM) and start on the same port."""
    real_vllm.thaw()
    real_vllm.wait_idle(60)
    client = Client()
    before = asyncio.run(observe_backend(client, real_vllm.url, Deadline.after(5)))
    real_vllm.restart()
    after = asyncio.run(observe_backend(client, real_vllm.url, Deadline.after(5)))
    assert after.reading.process_start > before.reading.process_start
    verdict = judge([before, after])
    assert (verdict.state, verdict.exit_code) == ("restarted", 0), verdict.reason
    assert "start time" in verdict.reason
    assert hangwatch_check(real_vllm.url, "--interval", "1")["verdict"] == "idle"
