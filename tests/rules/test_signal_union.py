"""The rules' progress and counter-reset expressions find what the plain signal chain finds.

- Counter resets: rules/render.py joins the counters as a balanced union with the per-kind token
  series summed first (``signals_expr``: cheaper for Prometheus to evaluate) instead of the plain
  chain ``label_replace(f(a)) or label_replace(f(b)) or ...`` summed without kind and signal.
  Checked against that chain, label for label, on the cases the scenarios do not have: an engine
  with one signal or none, tokens of two kinds, a counter reset inside the range, and target
  labels named ``kind`` (Prometheus then keeps the exporter's as ``exported_kind``) or ``signal``.
- Progress: one ``changes()`` of the exporter's progress fingerprint. Fed with what the exporter
  exposes for a run of readings (``families_for``), it must say "work" exactly where the chain
  of every signal's ``changes()`` does, and "none" exactly where that chain does.

The truth table (tests/scenarios) checks the states these feed.
"""
from __future__ import annotations

import subprocess

import yaml

from hangwatch.observation import Observation
from hangwatch.reading import Reading
from hangwatch.rules.render import COUNTER_SIGNALS, PROGRESS_SIGNALS, progress_expr, resets_expr
from tests.rules.observations import exported_samples
from tests.support.require import require_binary

RANGE = "37500ms"  # at 60 s it holds the readings at 30, 45 and 60 s (one every 15 s)


def chain(function: str, signals) -> str:
    """The plain formulation: each signal labelled and joined left to right, then summed."""
    joined = " or ".join(f'label_replace({function}({name}[{RANGE}]), "signal", "{label}", "", "")'
                         for name, label in signals)
    return f"sum without (kind, signal) ({joined})"


def series(name: str, target: str, values: str, **labels: str) -> dict:
    found = {"job": "hangwatch", "instance": target, "target": target, **labels}
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in found.items()) + "}", "values": values}


INPUT = [
    # t1, a vLLM: every signal; generation tokens reset inside the range.
    series("hangwatch_engine_steps_total", "t1", "0 1 2 3 4"),
    series("hangwatch_engine_tokens_total", "t1", "5 5 5 5 5", kind="prompt"),
    series("hangwatch_engine_tokens_total", "t1", "1 2 3 0 1", kind="generation"),
    series("hangwatch_prefix_cache_queries_total", "t1", "1 1 1 1 1"),
    series("hangwatch_requests_finished_total", "t1", "0 0 0 1 1"),
    series("hangwatch_kv_cache_usage_ratio", "t1", "0.1 0.1 0.2 0.2 0.1"),
    # t2: one kind of tokens, flat; t3: KV usage only; t4: no signal at all (FastChat).
    series("hangwatch_engine_tokens_total", "t2", "7 7 7 7 7", kind="prompt"),
    series("hangwatch_kv_cache_usage_ratio", "t3", "0.5 0.5 0.5 0.6 0.6"),
    series("up", "t4", "1 1 1 1 1"),
    # t5: a target label `kind`; t6: a target label `signal`.
    series("hangwatch_engine_steps_total", "t5", "1 1 1 1 2", kind="x"),
    series("hangwatch_engine_tokens_total", "t5", "3 3 3 3 1", kind="x", exported_kind="prompt"),
    series("hangwatch_engine_steps_total", "t6", "0 0 0 0 0", signal="steps"),
    series("hangwatch_prefix_cache_queries_total", "t6", "1 2 3 4 5", signal="steps"),
]


def sample(target: str, value: float, **labels: str) -> tuple[str, dict, float]:
    return target, labels, value


def samples(record: str, expected) -> list[dict]:
    return [{"labels": record + "{" + ", ".join(f'{k}="{v}"' for k, v in
                                               {"job": "hangwatch", "instance": target, "target": target,
                                                **labels}.items()) + "}", "value": value}
            for target, labels, value in expected]


RESETS = [sample("t1", 1), sample("t2", 0), sample("t5", 0), sample("t5", 1, exported_kind="prompt"), sample("t6", 0)]


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


def test_the_shipped_resets_expression_answers_as_the_plain_chain(tmp_path):
    rules = [{"record": "shipped:resets", "expr": resets_expr(RANGE)},
             {"record": "chain:resets", "expr": chain("resets", COUNTER_SIGNALS)}]
    checks = [{"expr": name, "eval_time": "60s", "exp_samples": samples(name, RESETS)}
              for name in ("shipped:resets", "chain:resets")]
    checks += [{"expr": same("shipped:resets", "chain:resets"), "eval_time": t, "exp_samples": []}
               for t in ("15s", "30s", "45s", "60s")]
    promtool(tmp_path, rules, INPUT, checks)


# Per target, an engine and its readings, one every 15 s (None: the signal is not on the page).
# Each run moves its signals in a different pattern: one at a time, several at once, a counter
# reset, the gauge going down and back, nothing for three readings, the smallest steps.
_V = ("steps", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "finished", "kv_cache_usage")
RUNS = {
    "v1": ("vllm", [(0, 5, 1, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1),
                    (1, 5, 2, 1, 0, 0.2), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 0, 0.1), (1, 5, 2, 1, 1, 0.1),
                    (1, 5, 2, 1, 1, 0.1), (1, 5, 2, 1, 1, 0.1), (1, 5, 0, 1, 1, 0.1), (1, 5, 0, 1, 1, 0.1)]),
    "v2": ("vllm", [(9, 9, 9, 9, 9, 0.5)] * 4 + [(9, 9, 9, 10, 9, 0.5)] + [(9, 9, 9, 10, 9, 0.5)] * 4
           + [(9, 9, 9, 10, 9, 0.5000001)] + [(9, 9, 9, 10, 9, 0.5000001)] * 2),
    "l1": ("llamacpp", [(s, 100 + s // 3, 0, None, None, 0.25) for s in (0, 0, 0, 3, 3, 3, 3, 6, 6, 6, 9, 9)]),
    "l2": ("llamacpp", [(7, 7, 7, None, None, k) for k in (0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.3, 0.3)]),
    "g1": ("tgi", [(s, None, s * 10, None, s // 2, None) for s in (4, 4, 5, 5, 5, 5, 6, 7, 7, 7, 7, 7)]),
}


def reading_series() -> list[dict]:
    """What Prometheus stores for RUNS, from the exporter's own series (``families_for``)."""
    values: dict[str, list[str]] = {}
    for target, (engine, rows) in RUNS.items():
        labels = {"job": "hangwatch", "instance": target, "target": target}
        for i, row in enumerate(rows):
            fields = {name: (None if value is None else float(value)) for name, value in zip(_V, row)}
            reading = Reading(engine=engine, running=1.0, waiting=0.0, **fields)
            for name, value in exported_samples(Observation(15.0 * i, "ok", reading=reading), "backend",
                                                labels).items():
                values.setdefault(name, ["_"] * len(rows))[i] = repr(value)
    return [{"series": name, "values": " ".join(points)} for name, points in values.items()]


def test_the_progress_fingerprint_finds_work_exactly_where_the_signal_chain_does(tmp_path):
    rules = [{"record": "shipped:progress", "expr": progress_expr(RANGE)},
             {"record": "chain:progress", "expr": chain("changes", PROGRESS_SIGNALS)}]
    worked = "(shipped:progress > bool 0)", "(chain:progress > bool 0)"
    times = [f"{15 * i}s" for i in range(2, 12)]
    checks = [{"expr": same(*worked), "eval_time": t, "exp_samples": []} for t in times]
    # Not vacuous: work and none both occur. At 45 s (readings 1-3) only l1 and g1 moved; at
    # 165 s (readings 9-11) v1 (a counter reset) and l1 did.
    checks.append({"expr": "count(shipped:progress == 0)", "eval_time": "45s", "exp_samples": [{"value": 3}]})
    checks.append({"expr": "count(shipped:progress > 0)", "eval_time": "165s", "exp_samples": [{"value": 2}]})
    checks.append({"expr": "count(shipped:progress == 0)", "eval_time": "165s", "exp_samples": [{"value": 3}]})
    promtool(tmp_path, rules, reading_series(), checks)
