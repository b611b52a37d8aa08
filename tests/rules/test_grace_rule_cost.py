"""An engine's minimum grace costs the rules a range read only where it changes a verdict.

Hung already needs three readings without progress, so a grace spanning three readings or fewer
can never hold a hang back: at a 30 s scrape (the interval most users run) and slower, every
engine's grace fits inside those three readings, and the truth table there
(tests/scenarios/*_30s.yaml) is the same whether the grace rule reads two readings or three.
What differs is cost: a grace rule that reads the progress fingerprint itself evaluates more
range selectors per target every evaluation, the costliest part of the recording group at
fleet scale (bench/RESULTS-exporter.md). So where the graces span at most three readings, the
grace rule must reuse the recorded three-reading progress and read no range of its own.
"""
from __future__ import annotations

import pytest
import yaml

from hangwatch.engines import ENGINES
from hangwatch.rules.render import Settings, write

WITHIN_GRACE = "target:hangwatch_engine_progress:within_grace"


def within_grace_expr(tmp_path, scrape: float) -> str:
    path, = write(tmp_path, Settings(scrape_interval=scrape), ["hangwatch-recording.yml"])
    rules = [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    return next(rule["expr"] for rule in rules if rule.get("record") == WITHIN_GRACE)


@pytest.mark.parametrize("scrape", [30.0, 60.0])
def test_a_grace_inside_three_readings_reads_no_range_of_its_own(tmp_path, scrape):
    longest = max(engine.min_grace for engine in ENGINES)
    assert 0 < longest <= 2 * scrape, "this interval does not put every grace inside three readings"
    expr = within_grace_expr(tmp_path, scrape)
    assert "changes_3scrapes" in expr, expr
    assert "[" not in expr, f"the grace rule at a {scrape:g} s scrape reads ranges of its own:\n{expr}"


def test_a_grace_beyond_three_readings_reads_its_own_range(tmp_path):
    """The other side, so the test above cannot pass on a rule that never reads a range: at a
    15 s scrape SGLang's 45 s grace spans four readings, which only a range of its own can see."""
    assert "hangwatch_engine_progress_fingerprint[" in within_grace_expr(tmp_path, 15.0)
