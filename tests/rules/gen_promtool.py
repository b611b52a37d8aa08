"""The truth table, engine two: turn tests/scenarios/*.yaml into ``promtool test rules`` files.

Each scenario becomes one test file: ``input_series`` are the exporter's series as
Prometheus would have stored them (a value per scrape; ``stale`` where a series disappears,
as Prometheus marks it; ``_`` where it never was), a ``promql_expr_test`` per step for the
state recording rule (all six state series, exactly one of them 1), and an
``alert_rule_test`` per step and alert, plus the scenario's extra ``alert_checks``.

    python -m tests.rules.gen_promtool --out DIR [--scrape-interval 15s]

By default the shipped rule files are tested as they are (they assume a 15 s scrape);
``--scrape-interval`` tests the files ``rules/retime.py`` derives instead, with every time
in the scenario scaled alike.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import yaml

from .scenarios import (ALERTS, EVAL_OFFSET, ROOT, RULE_FILES, SCRAPE_INTERVAL, STATES,
                        TARGET_LABELS, Scenario, Step, load_all)

STATE_RECORD = "target:hangwatch_backend_state:current"
BACKEND_ALERTS = ("HangwatchBackendHung", "HangwatchBackendDown", "HangwatchBackendBlind",
                  "HangwatchBackendRestarted")

_COUNTERS = (("steps", "hangwatch_engine_steps_total", {}),
             ("prompt", "hangwatch_engine_tokens_total", {"kind": "prompt"}),
             ("gen", "hangwatch_engine_tokens_total", {"kind": "generation"}),
             ("prefix", "hangwatch_prefix_cache_queries_total", {}),
             ("finished", "hangwatch_requests_finished_total", {}),
             ("kv", "hangwatch_kv_cache_usage_ratio", {}),
             ("start", "hangwatch_process_start_time_seconds", {}))


def load_retime():
    spec = importlib.util.spec_from_file_location("hangwatch_retime", ROOT / "rules" / "retime.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _series_name(name: str, extra: dict | None = None, base: dict | None = None) -> str:
    labels = {**(TARGET_LABELS if base is None else base), **(extra or {})}
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def samples_at(step: Step, module: str, engine: str = "vllm") -> dict[str, float]:
    """The series (with labels) Prometheus stores for this step's scrape, and their values."""
    if step.status == "absent":
        return {}
    if step.status == "gap":
        return {_series_name("up"): 0}
    out = {_series_name("up"): 1}
    answered = step.status in ("ok", "blind")
    out[_series_name("hangwatch_up")] = 1 if answered else 0
    out[_series_name("hangwatch_connection_stalled")] = 1 if step.status == "timeout" else 0
    found = engine if step.status == "ok" and module != "proxy" else ""  # as the exporter labels it
    out[_series_name("hangwatch_backend_info", {"engine": found, "module": module, "models": "", "version": ""})] = 1
    if module == "proxy":
        return out
    out[_series_name("hangwatch_metrics_available")] = 1 if step.status == "ok" else 0
    out[_series_name("hangwatch_probe_failed")] = 1 if step.probe == "failed" else 0
    out[_series_name("hangwatch_probe_rejected")] = 1 if step.probe == "rejected" else 0
    if step.status != "ok":
        return out
    v = step.values
    out[_series_name("hangwatch_requests_running")] = v["running"]
    out[_series_name("hangwatch_requests_waiting")] = v["waiting"]
    out[_series_name("hangwatch_requests_in_flight")] = step.in_flight
    out[_series_name("hangwatch_requests_schedulable")] = step.schedulable
    if v.get("deferred") is not None:
        out[_series_name("hangwatch_requests_deferred")] = v["deferred"]
    out[_series_name("hangwatch_engine_asleep")] = 1 if v.get("asleep") else 0
    for key, name, extra in _COUNTERS:
        if v.get(key) is not None:
            out[_series_name(name, extra)] = v[key]
    if step.probe is not None:
        out[_series_name("hangwatch_probe_success")] = 1 if step.probe == "answered" else 0
    return out


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def input_series(scenario: Scenario) -> list[dict]:
    per_step = [samples_at(step, scenario.module, scenario.engine) for step in scenario.steps]
    names = sorted({name for samples in per_step for name in samples})
    series = []
    for name in names:
        values, present = [], False
        for samples in per_step:
            if name in samples:
                values.append(_number(samples[name]))
                present = True
            else:
                values.append("stale" if present else "_")
                present = False
        series.append({"series": name, "values": " ".join(values)})
    return series


def _alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULE_FILES[1].read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _render(template: str, labels: dict) -> str:
    def label(match):
        return labels.get(match.group(1), "")
    text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", label, template)
    if "{{" in text:
        raise ValueError(f"template too rich for the generator: {template!r}")
    return text


def expected_alert(name: str, rules: dict[str, dict]) -> dict:
    rule = rules[name]
    series = {"job": "hangwatch"} if name == "HangwatchExporterAbsent" else dict(TARGET_LABELS)
    labels = {**series, **rule.get("labels", {})}
    return {"exp_labels": labels,
            "exp_annotations": {k: _render(v, labels) for k, v in rule.get("annotations", {}).items()}}


def _duration(seconds: float, retime) -> str:
    return retime.format_duration(seconds)


def promtool_test(scenario: Scenario, rule_files: list[Path], scale: float = 1.0) -> dict:
    """One ``promtool test rules`` document for ``scenario`` (times scaled by ``scale``)."""
    retime = load_retime()
    rules = _alert_rules()
    expr_tests, alert_tests = [], []
    for step in scenario.steps:
        at = _duration(step.eval_time * scale, retime)
        if step.expect_promql == "none":
            samples = []
        else:
            samples = [{"labels": _series_name(STATE_RECORD, {"state": state}),
                        "value": 1 if state == step.expect_promql else 0} for state in STATES]
        expr_tests.append({"expr": STATE_RECORD, "eval_time": at, "exp_samples": samples})
        for alert in ALERTS:
            firing = [expected_alert(alert, rules)] if alert in step.alerts else []
            alert_tests.append({"eval_time": at, "alertname": alert, "exp_alerts": firing})
    for seconds, firing_names in scenario.alert_checks:
        at = _duration(seconds * scale, retime)
        for alert in ALERTS:
            firing = [expected_alert(alert, rules)] if alert in firing_names else []
            alert_tests.append({"eval_time": at, "alertname": alert, "exp_alerts": firing})
    return {
        "rule_files": [str(path) for path in rule_files],
        "evaluation_interval": _duration(EVAL_OFFSET * scale, retime),
        # promtool otherwise evaluates the groups in random order; recording first mirrors
        # the worst case being no worse than a real Prometheus, where the alert group may
        # lag the recording group by up to one interval (counted in the latency budget).
        "group_eval_order": ["hangwatch-recording", "hangwatch-alerts"],
        "tests": [{
            "name": scenario.name,
            "interval": _duration(SCRAPE_INTERVAL * scale, retime),
            "input_series": input_series(scenario),
            "promql_expr_test": expr_tests,
            "alert_rule_test": alert_tests,
        }],
    }


def write_all(out: Path, scrape_interval: float = SCRAPE_INTERVAL) -> list[Path]:
    """Write one test file per scenario into ``out`` (rules retimed if the interval differs)."""
    out.mkdir(parents=True, exist_ok=True)
    scale = scrape_interval / SCRAPE_INTERVAL
    rule_files = list(RULE_FILES)
    if scale != 1.0:
        retime = load_retime()
        rule_files = []
        for path in RULE_FILES:
            target = out / path.name
            target.write_text(retime.retime_text(path.read_text(), scrape_interval, all_durations=True))
            rule_files.append(target)
    written = []
    for scenario in load_all():
        path = out / f"{scenario.name}.test.yml"
        path.write_text(yaml.safe_dump(promtool_test(scenario, rule_files, scale), sort_keys=False, width=200))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scrape-interval", default="15s")
    args = parser.parse_args(argv)
    for path in write_all(args.out, load_retime().parse_duration(args.scrape_interval)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
