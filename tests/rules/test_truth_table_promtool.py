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
from dataclasses import replace

import pytest
import yaml

from hangwatch.rules.render import Settings
from tests.support.require import require_binary

from .gen_promtool import BASELINE, PER_SEMANTICS, VARIANTS, Timing, promtool_test, rule_files, stall_windows, write_all
from .scenarios import load_all

SCENARIOS = load_all()


def run(promtool: str, paths) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", *map(str, paths)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """The rule files per (scrape interval, range semantics), rendered once."""
    cache = {}

    def get(scrape: float, semantics: str, windows=()):
        key = (scrape, semantics, windows)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"rules-{scrape:g}-{semantics}")
            cache[key] = rule_files(out, Settings(scrape_interval=scrape, stall_windows=windows), semantics)
        return cache[key]
    return get


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_promql_state_and_alerts_match_truth_table(scenario, rules, tmp_path):
    """On the schedule and at 4 offsets off it (jittered); closed and left-open ranges."""
    promtool = require_binary("promtool")
    paths = []
    for semantics, variants in PER_SEMANTICS.items():
        path = tmp_path / f"{scenario.name}.{semantics}.test.yml"
        document = promtool_test(scenario, rules(scenario.scrape_interval, semantics, stall_windows(scenario)),
                                 variants)
        path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
        paths.append(path)
    result = run(promtool, paths)
    assert result.returncode == 0, f"{scenario.name}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_shrunk_rules_keep_the_truth_table(scenario, tmp_path):
    """The end-to-end tests and the demo shrink every duration (wall-clock ones too) with the
    scrape interval: rules rendered for a 3 s scrape with wall-clock durations x 1/5 pass the
    same truth table, every time scaled alike. (One test per scenario: the whole table is
    a minute of promtool, which the fast tier's two workers share this way.)"""
    promtool = require_binary("promtool")
    paths = write_all(tmp_path, scale=0.2, variants=(BASELINE[0], VARIANTS[-1]), names={scenario.name})
    assert paths, scenario.name
    result = run(promtool, paths)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


GRACE_SCENARIOS = {"llamacpp": "llamacpp_grace_3s", "sglang": "sglang_grace_3s", "tgi": "tgi_grace_3s"}


@pytest.mark.parametrize("engine", sorted(GRACE_SCENARIOS))
def test_each_engines_grace_branch_is_needed_at_a_3s_scrape(engine, tmp_path):
    """The per-engine grace is behaviour, not text: render the 3 s rules without one engine's
    branch (its min_grace as 0) and that engine's scenario fails - hung 24 s too early - while
    it passes with the branch (test_promql_state_and_alerts_match_truth_table)."""
    promtool = require_binary("promtool")
    scenario = next(s for s in SCENARIOS if s.name == GRACE_SCENARIOS[engine])
    engines = tuple(replace(e, min_grace=0.0) if e.name == engine else e for e in Settings().engines)
    paths = rule_files(tmp_path / "rules", Settings(scrape_interval=3.0, engines=engines))
    assert f'engine="{engine}"' not in paths[0].read_text()
    path = tmp_path / "without-branch.test.yml"
    path.write_text(yaml.safe_dump(promtool_test(scenario, paths, BASELINE), sort_keys=False, width=200))
    result = run(promtool, [path])
    assert result.returncode != 0, f"{scenario.name} passes without the {engine} grace branch"
    output = result.stdout + result.stderr
    step4 = Timing(3000, BASELINE[0]).state_check(4) / 1000  # three flat readings: hung without the grace
    failure = output.split(f"time: {int(step4)}s{round(step4 % 1 * 1000)}ms", 1)[-1].split("expr:", 1)[0]
    assert 'got:' in failure and 'state="hung", target="vllm-a"} 1E+00' in failure.split("got:")[1], output[-3000:]
