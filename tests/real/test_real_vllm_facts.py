"""Facts about a real vLLM 0.32 that hangwatch's verdict core depends on.

Each test reads /metrics directly with the tiny parser in ``vllm_server.py`` (not hangwatch's
own package) from the one real vLLM of the session (fixture ``real_vllm``). Readings are
taken the way hangwatch takes them: two or more readings an interval (≥ 1 s) apart; every
other wait polls a condition under a deadline.

The restart is proven in ``test_real_vllm_verdicts.py``; the ``vllm`` fixture proves the
server healthy before every test, so these hold in any order.
"""
import time

import pytest
import requests

from harness.vllm_server import LONG_PROMPT_TOKENS, MAX_MODEL_LEN

pytestmark = pytest.mark.real

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
STEPS = "vllm:iteration_tokens_total_count"
TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                  "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum")
PREFILL_PROGRESS = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total")


def reading_after(server, earlier, interval_s=1.0, deadline_s=30):
    """The first /metrics reading sent at least ``interval_s`` after ``earlier`` was answered: a
    page can take over a second to come back on a loaded machine, and a reading sent the moment
    it did would see the same engine state (CI: 1.29 s apart by send time, 0 s by answer)."""
    return server.wait_until(lambda p: p.at - earlier.done_at >= interval_s, deadline_s,
                             interval=0.05, what=f"a reading {interval_s} s later")


def changed(a, b, names):
    return [n for n in names if a.value(n) != b.value(n)]


def test_busy_generations_make_steps_progress(vllm):
    with vllm.generations(4, max_tokens=20000, deadline_s=90) as load:
        first = vllm.wait_until(lambda p: (p.value(RUNNING) or 0) >= 1 and p.value(STEPS),
                                30, what="generations running")
        second = reading_after(vllm, first, 1.0)
        assert second.value(RUNNING) >= 1, second.value(RUNNING)
        assert second.value(STEPS) > first.value(STEPS), (
            f"{STEPS} did not move in {second.at - first.at:.2f} s with "
            f"{second.value(RUNNING)} requests running")
        assert second.value("vllm:generation_tokens_total") > first.value(
            "vllm:generation_tokens_total")
        assert not load.errors(), load.errors()


def read_prefill(vllm, tokens: int):
    """One ``tokens``-token prompt, /metrics read 1 s apart until its first output token: the
    page before it, the generation, and the pages that fully arrived well before that token
    with the request running."""
    before = vllm.metrics()
    g = vllm.long_prompt(tokens, max_tokens=4, deadline_s=120)
    pages = []
    deadline = time.monotonic() + 120
    try:
        while g.first_token_at is None and g.running and time.monotonic() < deadline:
            pages.append(vllm.metrics())
            next_at = pages[-1].at + 1.0  # readings 1 s apart: the interval under test
            while time.monotonic() < next_at and g.first_token_at is None:
                time.sleep(0.02)
        g.join(60)
    finally:
        g.cancel()
    assert g.error is None, g.error
    assert g.usage and g.usage["prompt_tokens"] == tokens, g.usage
    during = [p for p in pages if p.done_at < g.first_token_at - 0.2 and p.value(RUNNING)]
    return before, g, during


def test_long_chunked_prefill_moves_kv_not_token_counters(vllm):
    """During one ≥ 20k-token chunked prefill (before its first output token), readings 1 s
    apart: 1 running, the token counters (prompt, generation, iterations) stay flat, and the
    KV-cache usage grows. ``prefix_cache_queries_total`` jumps once by the prompt length when
    the request is scheduled, then stays flat while the chunks run.

    32k tokens take 11-28 s on the 2-core machines this was measured on, and 3 s on one with
    AVX-512 (CI, 2026-12-02): too short for three readings 1 s apart. A prefill that short is
    read again with twice the tokens (a step's cost grows with the context cached, so it lasts
    well over twice as long), within the model's 64k context."""
    assert LONG_PROMPT_TOKENS >= 20000
    for tokens in (LONG_PROMPT_TOKENS, min(2 * LONG_PROMPT_TOKENS, MAX_MODEL_LEN - 1024)):
        before, g, during = read_prefill(vllm, tokens)
        if len(during) >= 3:
            break
    prefill_s = g.first_token_at - g.started_at
    assert len(during) >= 3, (
        f"prefill too short to read it 1 s apart: {tokens} tokens, first token after {prefill_s:.1f} s, "
        f"{len(during)} readings with the request running")
    assert all(p.value(RUNNING) == 1 for p in during), [p.value(RUNNING) for p in during]
    assert all(not p.value(WAITING) for p in during)

    # The token counters stay flat for the whole prefill.
    for a, b in zip(during, during[1:]):
        assert not changed(a, b, TOKEN_COUNTERS), (
            f"token counters moved during the prefill: {changed(a, b, TOKEN_COUNTERS)}")
    assert not changed(before, during[-1], TOKEN_COUNTERS[:2]), "prompt/generation moved early"

    # KV-cache usage climbs; across any two consecutive intervals (hangwatch's hung window)
    # at least one prefill-progress series moves.
    assert during[-1].value("vllm:kv_cache_usage_perc") > during[0].value(
        "vllm:kv_cache_usage_perc")
    for a, b in zip(during, during[2:]):
        assert changed(a, b, PREFILL_PROGRESS), (
            f"nothing moved in {b.at - a.at:.1f} s of prefill: "
            f"kv {a.value('vllm:kv_cache_usage_perc')} -> {b.value('vllm:kv_cache_usage_perc')}")
    # prefix_cache_queries_total jumped by the prompt length at scheduling and is flat after.
    assert during[0].value("vllm:prefix_cache_queries_total") - before.value(
        "vllm:prefix_cache_queries_total") == tokens
    assert len({p.value("vllm:prefix_cache_queries_total") for p in during}) == 1

    # Once the first token is out, the token counters move.
    after = vllm.wait_until(lambda p: p.value("vllm:prompt_tokens_total")
                            > during[-1].value("vllm:prompt_tokens_total"), 30,
                            what="prompt_tokens_total after the prefill")
    assert after.value("vllm:prompt_tokens_total") - before.value(
        "vllm:prompt_tokens_total") == tokens


def test_frozen_engine_answers_metrics_with_every_counter_flat(vllm):
    with vllm.generations(4, max_tokens=20000, deadline_s=90) as load:
        vllm.wait_until(lambda p: p.value(RUNNING) == 4, 30, what="4 running")
        try:
            vllm.freeze()
            t0 = time.monotonic()
            answered = vllm.metrics(timeout=5)
            assert answered.done_at - t0 < 1.0, f"/metrics took {answered.done_at - t0:.2f} s"
            # Once the API server has flushed what the engine had finished before the stop,
            # nothing moves: two readings 2 s apart after that are identical.
            first = vllm.wait_frozen(running=4)
            second = reading_after(vllm, first, 2.0)
            assert second.done_at - second.at < 1.0
            assert requests.get(f"{vllm.url}/health", timeout=5).status_code == 200
            assert second.value(RUNNING) == 4
            counters_1, counters_2 = first.counters(), second.counters()
            assert len(counters_1) > 20 and counters_1.keys() == counters_2.keys()
            moved = sorted({k[0] for k in counters_1 if counters_1[k] != counters_2[k]})
            assert not moved, f"counters moved while the EngineCore was stopped: {moved}"
            # Measured: gauges are frozen too (every vllm: sample is identical).
            assert first.series() == second.series()
        finally:
            vllm.thaw()
        vllm.wait_until(lambda p: p.value(STEPS) > second.value(STEPS)
                        and p.value("vllm:generation_tokens_total")
                        > second.value("vllm:generation_tokens_total"),
                        30, what="progress after thaw")
        assert not load.errors(), load.errors()
