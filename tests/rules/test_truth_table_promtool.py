"""The truth table, engine two: the same scenarios through ``promtool test rules``.

Each scenario runs against the rules ``hangwatch rules`` writes for its scrape interval (15 s,
or the scenario's ``scrape_interval``: the llama.cpp, SGLang and TGI grace scenarios at 3 s,
where the wall-clock grace spans more readings than the default three), with the state checked
at several instants after each reading, on and off the scrape schedule (jittered), and under
both range semantics (Prometheus 2's closed ranges, Prometheus 3's left-open ones): see
gen_promtool. The test files are generated at test time into a temporary directory (nothing
generated is committed, so nothing can be stale). promtool is a real part: missing in CI is a
failure.
"""
from __future__ import annotations

import subprocess

import pytest
import yaml

from hangwatch.rules.render import Settings
from tests.support.require import require_binary

from .gen_promtool import BASELINE, SEMANTICS, VARIANTS, promtool_test, rule_files, write_all
from .scenarios import load_all

SCENARIOS = load_all()


def run(promtool: str, paths) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", *map(str, paths)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """The rule files per (scrape interval, range semantics), rendered once."""
    cache = {}

    def get(scrape: float, semantics: str):
        key = (scrape, semantics)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"rules-{scrape:g}-{semantics}")
            cache[key] = rule_files(out, Settings(scrape_interval=scrape), semantics)
        return cache[key]
    return get


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_promql_state_and_alerts_match_truth_table(scenario, rules, tmp_path):
    """Every variant (4 offsets x on/off schedule) under both range semantics."""
    promtool = require_binary("promtool")
    paths = []
    for semantics in SEMANTICS:
        path = tmp_path / f"{scenario.name}.{semantics}.test.yml"
        document = promtool_test(scenario, rules(scenario.scrape_interval, semantics), VARIANTS)
        path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
        paths.append(path)
    result = run(promtool, paths)
    assert result.returncode == 0, f"{scenario.name}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"


def test_shrunk_rules_keep_the_truth_table(tmp_path):
    """The end-to-end tests and the demo shrink every duration (wall-clock ones too) with the
    scrape interval: rules rendered for a 3 s scrape with wall-clock durations x 1/5 pass the
    same truth table, every time scaled alike."""
    promtool = require_binary("promtool")
    paths = write_all(tmp_path, scale=0.2, variants=BASELINE + (VARIANTS[-1],))
    result = run(promtool, paths)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
