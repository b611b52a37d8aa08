"""The truth table, engine one: every scenario step served as a real page, observed through
production's observer (page reader, ``observe_load``, the probe) and judged by
``hangwatch.verdict.judge``.

The same served observations feed the promtool tests (``test_truth_table_promtool``), so the
Python verdict and the Prometheus rules cannot drift apart, and neither can drift from when
production sends its idle probe.
"""
from __future__ import annotations

import pytest

from hangwatch.verdict import judge

from .scenarios import Scenario, load_all
from .served import served

SCENARIOS = load_all()


def python_verdicts(scenario: Scenario) -> list[str]:
    """The verdict after each step ("none" where no reading was taken)."""
    observations, verdicts = [], []
    for seen in served(scenario.name):
        if seen.observation is None:
            verdicts.append("none")
            continue
        observations.append(seen.observation)
        verdicts.append(judge(observations, grace=scenario.grace, stall_window=scenario.window()).state)
    return verdicts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_python_verdict_matches_truth_table(scenario: Scenario):
    got = python_verdicts(scenario)
    expected = [step.expect for step in scenario.steps]
    mismatches = [f"step {i} (t={s.time}s): expected {e}, judge() says {g}"
                  for i, (s, e, g) in enumerate(zip(scenario.steps, expected, got)) if e != g]
    assert not mismatches, f"{scenario.name}:\n" + "\n".join(mismatches)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_idle_probe_reaches_the_server_only_when_safe(scenario: Scenario):
    """Seen at the server: never a probe while work is in flight or the engine sleeps (the rule
    the product exists for); one probe, at most, per reading; and a probe wherever a step says
    how it is answered. The observation tells the truth about it."""
    problems = []
    for step, seen in zip(scenario.steps, served(scenario.name)):
        where = f"step {step.index} (t={step.time}s, {step.status}, in flight {step.in_flight:g})"
        if seen.probes_received and (step.in_flight > 0 or step.values.get("asleep")):
            problems.append(f"{where}: probed with work in flight or asleep")
        if seen.probes_received > 1:
            problems.append(f"{where}: {seen.probes_received} probes in one reading")
        if seen.declared_probe is not None and not seen.probes_received:
            problems.append(f"{where}: declares probe {seen.declared_probe!r}, none reached the server")
        sent = seen.observation is not None and seen.observation.probe is not None
        if sent != bool(seen.probes_received):
            problems.append(f"{where}: the observation says probe sent={sent}, the server saw "
                            f"{seen.probes_received}")
    assert not problems, f"{scenario.name}:\n" + "\n".join(problems)
