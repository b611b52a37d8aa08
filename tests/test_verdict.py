"""The truth table as a pure function: observations over time → one verdict."""
from hangwatch.observation import Observation, ProbeResult
from hangwatch.reading import Reading
from hangwatch.verdict import judge

START = 1_764_468_000.0


def r(running=0, waiting=0, steps=0, prompt=0, gen=0, prefix=0, finished=0, kv=0.0, start=START, **kw):
    return Reading(engine="vllm", running=running, waiting=waiting, steps=steps, prompt_tokens=prompt,
                   generation_tokens=gen, prefix_cache_queries=prefix, finished=finished,
                   kv_cache_usage=kv, process_start=start, **kw)


def ok(t, reading, probe=None):
    return Observation(float(t), "ok", reading=reading, probe=probe)


GOOD = ProbeResult("answered", 0.05, "1-token completion answered in 50 ms")
BAD = ProbeResult("failed", 5.0, "1-token completion: connection accepted, no answer within 5s")


def test_steady_generation_is_busy_and_settled():
    v = judge([ok(0, r(running=4, steps=10, gen=40)), ok(5, r(running=4, steps=30, gen=120))])
    assert (v.state, v.settled) == ("busy", True)


def test_long_prefill_with_only_kv_usage_moving_is_busy_not_hung():
    readings = [r(running=1, prefix=30000, kv=0.1 * i) for i in range(1, 5)]
    for i in range(2, 5):
        assert judge([ok(t * 5, x) for t, x in enumerate(readings[:i])]).state == "busy"


def test_prefix_cache_queries_jump_alone_is_progress():
    v = judge([ok(0, r(running=1)), ok(5, r(running=1, prefix=24000))])
    assert v.state == "busy" and "prefix_cache_queries" in v.reason


def test_frozen_engine_is_hung_only_after_two_intervals():
    frozen = r(running=2, waiting=1, steps=99, gen=500, kv=0.3)
    one = judge([ok(0, frozen), ok(5, frozen)])
    assert (one.state, one.settled) == ("busy", False)
    two = judge([ok(0, frozen), ok(5, frozen), ok(10, frozen)])
    assert (two.state, two.settled) == ("hung", True)


def test_grace_postpones_hung():
    frozen = r(running=1, steps=5)
    observations = [ok(0, frozen), ok(5, frozen), ok(10, frozen)]
    assert judge(observations, grace=20).state == "busy"
    assert judge(observations + [ok(15, frozen), ok(20, frozen)], grace=20).state == "hung"


def test_stall_window_starts_after_last_progress():
    observations = [ok(0, r(running=1, steps=1)), ok(5, r(running=1, steps=2)), ok(10, r(running=1, steps=2))]
    assert judge(observations).state == "busy"  # only one interval without progress
    assert judge(observations + [ok(15, r(running=1, steps=2))]).state == "hung"


def test_request_arriving_at_a_frozen_idle_engine_does_not_count_as_progress():
    observations = [ok(0, r(), GOOD), ok(5, r(waiting=1)), ok(10, r(waiting=1))]
    v = judge(observations)
    assert (v.state, v.settled) == ("busy", False)
    assert judge(observations + [ok(15, r(waiting=1))]).state == "hung"


def test_restart_is_detected_by_start_time_and_counters_are_not_compared():
    before = r(running=2, steps=1000)
    after = r(running=2, steps=1000, start=START + 60)  # same counters, different process
    v = judge([ok(0, before), ok(5, before), ok(10, after)])
    assert v.state == "restarted" and "start time" in v.reason


def test_counter_reset_without_start_time_is_a_restart():
    v = judge([ok(0, r(running=1, steps=500, start=None)), ok(5, r(running=1, steps=3, start=None))])
    assert v.state == "restarted" and "backwards" in v.reason


def test_restarted_idle_server_is_asked_for_a_response():
    v = judge([ok(0, r(steps=500)), ok(5, r(start=START + 60), GOOD)])
    assert (v.state, v.exit_code) == ("restarted", 0)
    v = judge([ok(0, r(steps=500)), ok(5, r(start=START + 60), BAD)])
    assert (v.state, v.exit_code) == ("restarted", 2)


def test_idle_with_good_probe_is_idle():
    v = judge([ok(0, r(), GOOD)])
    assert (v.state, v.settled, v.exit_code) == ("idle", True, 0)


def test_idle_probe_failing_twice_is_hung():
    once = judge([ok(0, r(), BAD)])
    assert (once.state, once.settled) == ("idle", False)
    twice = judge([ok(0, r(), BAD), ok(5, r(), BAD)])
    assert (twice.state, twice.exit_code) == ("hung", 1)


def test_asleep_engine_is_idle_and_needs_no_probe():
    assert judge([ok(0, r(asleep=True))]).state == "idle"


def test_refused_is_down_never_hung():
    observations = [Observation(float(t), "refused", error="connection refused") for t in range(5)]
    v = judge(observations)
    assert (v.state, v.exit_code) == ("down", 2)


def test_accepted_but_silent_twice_is_hung():
    silent = Observation(0.0, "timeout", error="connection accepted, no answer within 5s")
    once = judge([silent])
    assert (once.state, once.settled) == ("down", False)
    assert judge([silent, silent]).state == "hung"
    assert judge([silent, ok(5, r(), GOOD), silent]).state == "down"


def test_blind_never_restarts():
    blind = Observation(0.0, "blind", error="/metrics answered HTTP 404")
    v = judge([blind, blind, blind])
    assert (v.state, v.exit_code) == ("blind", 2)


def test_proxy_answering_is_idle():
    assert judge([Observation(0.0, "ok")]).state == "idle"


REJECTED = ProbeResult("rejected", 0.01, "1-token completion was rejected with HTTP 401: give hangwatch the "
                       "server's API key (--api-key-file / api_key_file)", http_status=401)


def test_idle_probe_rejected_forever_is_idle_never_hung():
    observations = [ok(t * 5, r(), REJECTED) for t in range(20)]
    for i in range(1, len(observations) + 1):
        v = judge(observations[:i])
        assert (v.state, v.settled, v.exit_code) == ("idle", True, 0)
    assert "HTTP 401" in v.reason and "API key" in v.reason and "never counts" in v.reason


def test_a_rejected_probe_breaks_a_failure_streak():
    assert judge([ok(0, r(), BAD), ok(5, r(), REJECTED), ok(10, r(), BAD)]).state == "idle"
    assert judge([ok(0, r(), BAD), ok(5, r(), REJECTED), ok(10, r(), BAD), ok(15, r(), BAD)]).state == "hung"


def test_restarted_server_that_rejects_the_probe_is_answering():
    v = judge([ok(0, r(steps=500)), ok(5, r(start=START + 60), REJECTED)])
    assert (v.state, v.exit_code) == ("restarted", 0)


def test_only_deferred_requests_standing_still_is_busy_not_hung():
    """A decode server waiting on KV transfers from a slow prefill peer is not wedged."""
    stuck = [ok(t * 5, r(running=0, waiting=3, deferred=3, steps=100)) for t in range(10)]
    for i in range(1, len(stuck) + 1):
        assert judge(stuck[:i]).state == "busy"
    assert "outside the engine" in judge(stuck).reason


def test_a_schedulable_request_among_deferred_ones_standing_still_is_hung():
    readings = [r(running=0, waiting=3, deferred=3, steps=100)] * 2 + [r(running=0, waiting=4, deferred=3, steps=100)] * 3
    verdicts = [judge([ok(t * 5, x) for t, x in enumerate(readings[:i])]).state for i in range(1, 6)]
    assert verdicts == ["busy", "busy", "busy", "busy", "hung"]


def test_running_work_beside_deferred_requests_standing_still_is_hung():
    readings = [r(running=2, waiting=3, deferred=3, steps=100)] * 3
    assert judge([ok(t * 5, x) for t, x in enumerate(readings)]).state == "hung"
