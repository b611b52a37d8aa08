"""The truth table, engine two: the same scenarios through ``promtool test rules``.

The test files are generated into a temporary directory at test time from
tests/scenarios/*.yaml and the shipped rule files (nothing generated is committed, so
nothing can be stale). promtool is a real part: missing in CI is a failure.
"""
from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.support.require import require_binary

from .gen_promtool import promtool_test, write_all
from .scenarios import RULE_FILES, load_all

SCENARIOS = load_all()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_promql_state_and_alerts_match_truth_table(scenario, tmp_path):
    promtool = require_binary("promtool")
    path = tmp_path / f"{scenario.name}.test.yml"
    path.write_text(yaml.safe_dump(promtool_test(scenario, list(RULE_FILES)), sort_keys=False, width=200))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{scenario.name}:\n{result.stdout}\n{result.stderr}"


def test_retimed_rules_keep_the_truth_table(tmp_path):
    """The windows scale with the scrape interval: rules/retime.py's 3 s rules (the documented
    <= 15 s setting, every duration scaled by 1/5) pass the same truth table, times scaled alike.
    (3 s keeps every scaled time a whole number of evaluation steps, so ``for:`` boundaries
    stay exact.)"""
    promtool = require_binary("promtool")
    paths = write_all(tmp_path, scrape_interval=3.0)
    result = subprocess.run([promtool, "test", "rules", *map(str, paths)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
