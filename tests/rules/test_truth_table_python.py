"""The truth table, engine one: every scenario step through ``hangwatch.verdict.judge``.

The same scenarios feed the promtool tests (``test_truth_table_promtool``), so the Python
verdict and the Prometheus rules cannot drift apart.
"""
from __future__ import annotations

import pytest

from hangwatch.observation import Observation
from hangwatch.observation import ProbeResult
from hangwatch.reading import Reading
from hangwatch.verdict import judge

from .scenarios import Scenario, Step, load_all

SCENARIOS = load_all()

_READING = {"steps": "steps", "prompt": "prompt_tokens", "gen": "generation_tokens",
            "prefix": "prefix_cache_queries", "finished": "finished", "kv": "kv_cache_usage",
            "start": "process_start"}


def observation_for(step: Step, module: str, scenario_engine: str = "vllm") -> Observation | None:
    """What ``observe_backend``/``observe_proxy`` would have returned for this step."""
    taken_at = float(step.time)
    if not step.scraped:
        return None  # Prometheus got no reading from the exporter: nothing to judge
    if step.status == "refused":
        return Observation(taken_at, "refused", error="connection refused")
    if step.status == "timeout":
        return Observation(taken_at, "timeout", error="connection accepted, no answer within 5s")
    if step.status == "blind":
        return Observation(taken_at, "blind", error="/metrics answered HTTP 404")
    if module == "proxy":
        return Observation(taken_at, "ok")
    v = step.values
    reading = Reading(engine=scenario_engine, running=float(v["running"]), waiting=float(v["waiting"]),
                      asleep=bool(v.get("asleep")),
                      deferred=None if v.get("deferred") is None else float(v["deferred"]),
                      **{field: (None if v.get(key) is None else float(v[key])) for key, field in _READING.items()})
    probe = None
    if step.probe is not None:
        probe = ProbeResult(step.probe, 0.01, {"answered": "1-token completion answered", "failed": "timed out",
                                               "rejected": "rejected with HTTP 401"}[step.probe])
    return Observation(taken_at, "ok", reading=reading, probe=probe)


def python_verdicts(scenario: Scenario) -> list[str]:
    """The verdict after each step ("none" where no reading was taken)."""
    observations, verdicts = [], []
    for step in scenario.steps:
        observation = observation_for(step, scenario.module, scenario.engine)
        if observation is None:
            verdicts.append("none")
            continue
        observations.append(observation)
        verdicts.append(judge(observations, grace=scenario.grace).state)
    return verdicts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_python_verdict_matches_truth_table(scenario: Scenario):
    got = python_verdicts(scenario)
    expected = [step.expect for step in scenario.steps]
    mismatches = [f"step {i} (t={s.time}s): expected {e}, judge() says {g}"
                  for i, (s, e, g) in enumerate(zip(scenario.steps, expected, got)) if e != g]
    assert not mismatches, f"{scenario.name}:\n" + "\n".join(mismatches)


def test_hung_alert_only_follows_a_hung_verdict():
    """The restart alert fires only at steps whose verdict (Python's, and PromQL's) is hung."""
    for scenario in SCENARIOS:
        for step in scenario.steps:
            if "HangwatchBackendHung" in step.alerts:
                assert step.expect == "hung" and step.expect_promql == "hung", (scenario.name, step.index)
