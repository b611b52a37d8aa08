"""The progress and counter-reset expressions give the plain chain's answers, label for label.

rules/render.py joins the engine's signals as a balanced union with the per-kind token series
summed first (``signals_expr``: cheaper for Prometheus to evaluate) instead of the plain chain
``label_replace(f(a)) or label_replace(f(b)) or ...`` summed without kind and signal. The truth
table (tests/scenarios) checks the states; this checks the two expressions themselves against
that chain with promtool, on the cases the scenarios do not have: an engine with one signal or
none, tokens of two kinds, a counter reset inside the range, and target labels named ``kind``
(Prometheus then keeps the exporter's as ``exported_kind``) or ``signal``.
"""
from __future__ import annotations

import subprocess

import yaml

from hangwatch.rules.render import COUNTER_SIGNALS, PROGRESS_SIGNALS, progress_expr, resets_expr
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


PROGRESS = [sample("t1", 6), sample("t2", 0), sample("t3", 1), sample("t5", 1), sample("t5", 1, exported_kind="prompt"),
            sample("t6", 2)]
RESETS = [sample("t1", 1), sample("t2", 0), sample("t5", 0), sample("t5", 1, exported_kind="prompt"), sample("t6", 0)]


def test_the_shipped_progress_and_resets_expressions_answer_as_the_plain_chain(tmp_path):
    rules = {"groups": [{"name": "union", "rules": [
        {"record": "shipped:progress", "expr": progress_expr(RANGE)},
        {"record": "chain:progress", "expr": chain("changes", PROGRESS_SIGNALS)},
        {"record": "shipped:resets", "expr": resets_expr(RANGE)},
        {"record": "chain:resets", "expr": chain("resets", COUNTER_SIGNALS)},
    ]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    checks = [{"expr": name, "eval_time": "60s", "exp_samples": samples(name, expected)}
              for name, expected in (("shipped:progress", PROGRESS), ("chain:progress", PROGRESS),
                                     ("shipped:resets", RESETS), ("chain:resets", RESETS))]
    checks += [{"expr": f"{a} != {b} or {a} unless {b} or {b} unless {a}", "eval_time": t, "exp_samples": []}
               for a, b in (("shipped:progress", "chain:progress"), ("shipped:resets", "chain:resets"))
               for t in ("15s", "30s", "45s", "60s")]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": INPUT, "promql_expr_test": checks}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([require_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
