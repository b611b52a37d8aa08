"""The rules' one-series progress and restart expressions find what every signal would show.

The rules read engine work from one series per target, the exporter's progress fingerprint
(``changes()``), and a new process without a start time from another, the sum of its counters
(``resets()``): rules/windows.py ``progress_expr`` and ``resets_expr``. Before, they read each
signal over each range and joined the results, which was most of the recording group's cost.
Here both are fed what the exporter exposes for runs of readings (``tests.support.exposition.probe_text``) and
compared, with promtool, against that plain chain of every signal:

- progress: "work" exactly where the chain of every signal's ``changes()`` sees work, and "none"
  exactly where it sees none;
- restarts: a restart (every counter starting again from zero, with or without some work done
  already) exactly where the chain of every counter's ``resets()`` sees one.

The truth table (tests/scenarios) checks the states these feed.
"""
from __future__ import annotations

import subprocess

import yaml

from hangwatch.observation import Observation
from hangwatch.reading import Reading
from hangwatch.rules.render import progress_expr, resets_expr
from tests.rules.observations import exported_samples
from tests.support.require import require_binary

RANGE = "37500ms"  # at 60 s it holds the readings at 30, 45 and 60 s (one every 15 s)

# Every signal the exporter exposes, as the rules read them before (a kind label on tokens).
PROGRESS_SIGNALS = ("hangwatch_engine_steps_total", "hangwatch_prefix_cache_queries_total",
                    "hangwatch_requests_finished_total", "hangwatch_kv_cache_usage_ratio",
                    "hangwatch_engine_tokens_total")
COUNTER_SIGNALS = tuple(name for name in PROGRESS_SIGNALS if name.endswith("_total"))


def chain(function: str, signals) -> str:
    """The plain formulation: each signal (each kind of tokens) labelled, joined, then summed."""
    joined = " or ".join(f'label_replace({function}({name}[{RANGE}]), "signal", "{name}", "", "")'
                         for name in signals)
    return f"sum without (kind, signal) ({joined})"


def promtool(tmp_path, rules: list[dict], input_series: list[dict], checks: list[dict]) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "union", "rules": rules}]},
                                                       sort_keys=False))
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": input_series, "promql_expr_test": checks}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([require_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def same(a: str, b: str) -> str:
    """Empty exactly when ``a`` and ``b`` have the same series with the same values."""
    return f"{a} != {b} or {a} unless {b} or {b} unless {a}"


# Per target, an engine and its readings, one every 15 s (None: the signal is not on the page).
_V = ("steps", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "finished", "kv_cache_usage")


def reading_series(runs: dict) -> list[dict]:
    """What Prometheus stores for ``runs``, from the exporter's own series (``tests.support.exposition.probe_text``)."""
    values: dict[str, list[str]] = {}
    for target, (engine, rows) in runs.items():
        labels = {"job": "hangwatch", "instance": target, "target": target}
        for i, row in enumerate(rows):
            fields = {name: (None if value is None else float(value)) for name, value in zip(_V, row)}
            reading = Reading(engine=engine, running=1.0, waiting=0.0, **fields)
            for name, value in exported_samples(Observation(15.0 * i, "ok", reading=reading), "backend",
                                                labels).items():
                values.setdefault(name, ["_"] * len(rows))[i] = repr(value)
    return [{"series": name, "values": " ".join(points)} for name, points in values.items()]


# Each run moves its signals in a different pattern: one at a time, several at once, a counter
# reset, the gauge going down and back, nothing for three readings, the smallest steps.
PROGRESS_RUNS = {
    "v1": ("vllm", [(0, 5, 1, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1),
                    (1, 5, 2, 1, 0, 0.2), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 1, 0.1),
                    (1, 5, 2, 1, 1, 0.1), (1, 5, 2, 1, 1, 0.1), (1, 5, 0, 1, 1, 0.1), (1, 5, 0, 1, 1, 0.1)]),
    "v2": ("vllm", [(9, 9, 9, 9, 9, 0.5)] * 4 + [(9, 9, 9, 10, 9, 0.5)] + [(9, 9, 9, 10, 9, 0.5)] * 4
           + [(9, 9, 9, 10, 9, 0.5000001)] + [(9, 9, 9, 10, 9, 0.5000001)] * 2),
    "l1": ("llamacpp", [(s, 100 + s // 3, 0, None, None, 0.25) for s in (0, 0, 0, 3, 3, 3, 3, 6, 6, 6, 9, 9)]),
    "l2": ("llamacpp", [(7, 7, 7, None, None, k) for k in (0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3)]),
    "g1": ("tgi", [(s, None, s * 10, None, s // 2, None) for s in (4, 4, 5, 5, 5, 5, 6, 7, 7, 7, 7, 7)]),
}
TIMES = [f"{15 * i}s" for i in range(2, 12)]


def agree_with_the_chain(tmp_path, name: str, shipped: str, chained: str, runs: dict, times, counts) -> None:
    """``shipped`` and ``chained``, recorded as ``shipped:NAME`` and ``chain:NAME`` over what the
    exporter exposes for ``runs``, are > 0 for the same targets at every one of ``times``; and
    ``counts`` ((expression over shipped:NAME, time, expected count), ...) show the comparison
    is not vacuous."""
    rules = [{"record": f"shipped:{name}", "expr": shipped}, {"record": f"chain:{name}", "expr": chained}]
    checks = [{"expr": same(f"(shipped:{name} > bool 0)", f"(chain:{name} > bool 0)"), "eval_time": t,
               "exp_samples": []} for t in times]
    checks += [{"expr": f"count(shipped:{name} {test})", "eval_time": t, "exp_samples": [{"value": value}]}
               for test, t, value in counts]
    promtool(tmp_path, rules, reading_series(runs), checks)


def test_the_progress_fingerprint_finds_work_exactly_where_the_signal_chain_does(tmp_path):
    # Not vacuous: work and none both occur. At 45 s (readings 1-3) only l1 and g1 moved; at
    # 165 s (readings 9-11) v1 (a counter reset) and l1 did.
    agree_with_the_chain(tmp_path, "progress", progress_expr(RANGE), chain("changes", PROGRESS_SIGNALS),
                         PROGRESS_RUNS, TIMES, [("== 0", "45s", 3), ("> 0", "165s", 2), ("== 0", "165s", 3)])


# Restarts: a new process starts every counter again from zero. r1 restarts idle (zeros), r2
# after a little work in the new process, r3 (llama.cpp, two counters) twice; r4 never restarts
# while its counters grow at different paces; r5 has a single counter and restarts.
RESTART_RUNS = {
    "r1": ("vllm", [(500, 90, 4000, 90, 12, 0.2), (520, 90, 4100, 90, 12, 0.2), (0, 0, 0, 0, 0, 0.0),
                    (0, 0, 0, 0, 0, 0.0), (10, 20, 30, 20, 1, 0.1), (11, 20, 31, 20, 1, 0.1),
                    (12, 20, 32, 20, 1, 0.1), (13, 20, 33, 20, 1, 0.1)]),
    "r2": ("vllm", [(500, 90, 4000, 90, 12, 0.2), (520, 90, 4100, 90, 12, 0.2), (520, 90, 4100, 90, 12, 0.2),
                    (40, 30, 200, 30, 2, 0.1), (41, 30, 210, 30, 2, 0.1), (42, 30, 220, 30, 2, 0.1),
                    (43, 30, 230, 30, 2, 0.1), (44, 30, 240, 30, 2, 0.1)]),
    "r3": ("llamacpp", [(300, 1000, 2000, None, None, 0.3), (5, 20, 30, None, None, 0.1),
                        (9, 40, 60, None, None, 0.1), (12, 60, 90, None, None, 0.1), (1, 5, 0, None, None, 0.0),
                        (2, 6, 0, None, None, 0.0), (3, 7, 0, None, None, 0.0), (4, 8, 0, None, None, 0.0)]),
    "r4": ("vllm", [(s, 90, s * 7, 90 + s // 10, s // 20, 0.2) for s in (0, 10, 20, 30, 40, 50, 60, 70)]),
    "r5": ("tgi", [(s, None, None, None, None, None) for s in (50, 60, 70, 3, 4, 5, 6, 7)]),
}


def test_the_counters_sum_sees_a_restart_exactly_where_the_counter_chain_does(tmp_path):
    # Not vacuous. At 45 s (readings 1-3) r1, r2 and r5 restarted inside the range; at 60 s
    # (readings 2-4) r2, r3 and r5 (r1's restart is now before the range); at 105 s none.
    agree_with_the_chain(tmp_path, "resets", resets_expr(RANGE), chain("resets", COUNTER_SIGNALS), RESTART_RUNS,
                         [f"{15 * i}s" for i in range(1, 8)], [("> 0", "45s", 3), ("> 0", "60s", 3), ("== 0", "105s", 5)])
