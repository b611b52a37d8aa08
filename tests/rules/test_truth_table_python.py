"""The truth table, engine one: every scenario step through ``hangwatch.verdict.judge``.

The same scenarios feed the promtool tests (``test_truth_table_promtool``), so the Python
verdict and the Prometheus rules cannot drift apart.
"""
from __future__ import annotations

import pytest

from hangwatch.verdict import judge

from .observations import observation_for
from .scenarios import Scenario, load_all

SCENARIOS = load_all()


def python_verdicts(scenario: Scenario) -> list[str]:
    """The verdict after each step ("none" where no reading was taken)."""
    observations, verdicts = [], []
    for step in scenario.steps:
        observation = observation_for(step, scenario.module, scenario.engine)
        if observation is None:
            verdicts.append("none")
            continue
        observations.append(observation)
        verdicts.append(judge(observations, grace=scenario.grace, stall_window=scenario.window()).state)
    return verdicts


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_python_verdict_matches_truth_table(scenario: Scenario):
    got = python_verdicts(scenario)
    expected = [step.expect for step in scenario.steps]
    mismatches = [f"step {i} (t={s.time}s): expected {e}, judge() says {g}"
                  for i, (s, e, g) in enumerate(zip(scenario.steps, expected, got)) if e != g]
    assert not mismatches, f"{scenario.name}:\n" + "\n".join(mismatches)

