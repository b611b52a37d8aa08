"""The alerts that keep restarts from stopping silently, through ``promtool test rules``.

HangwatchWebhookCircuitOpen: the webhook spent a target's restart budget and restarts it no
more; one alert per target however many webhook replicas report it, after ``for: 1m`` and
not before, and never for a circuit that closed sooner. HangwatchExporterDown covers the
webhook's own scrape job: a webhook Prometheus cannot reach restarts nothing.
HangwatchRestartWithheld: a target re-checked hung and left to people by a fleet-wide limit.
"""
from __future__ import annotations

import re
import subprocess

import yaml

from tests.support.require import require_binary

from .scenarios import ROOT

RULES = ROOT / "rules" / "hangwatch-alerts.yml"
SCRAPE = 15
WEBHOOK = {"job": "hangwatch_webhook", "instance": "webhook:9878"}


def rule(name: str) -> dict:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for item in group["rules"]:
            if item.get("alert") == name:
                return item
    raise AssertionError(f"no alert {name} in {RULES}")


def series(metric: str, labels: dict, values: str) -> dict:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


def expected(name: str, labels: dict) -> dict:
    item = rule(name)
    merged = {**labels, **item["labels"]}
    def render(text):
        return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: merged.get(m.group(1), ""), text)
    return {"exp_labels": merged, "exp_annotations": {k: render(v) for k, v in item["annotations"].items()}}


def run(tmp_path, name: str, input_series: list[dict], alert_tests: list[dict]):
    promtool = require_binary("promtool")
    document = {"rule_files": [str(RULES)], "evaluation_interval": "3s",
                "tests": [{"name": name, "interval": f"{SCRAPE}s", "input_series": input_series,
                           "alert_rule_test": alert_tests}]}
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_circuit_open_fires_after_a_minute_once_per_target_whatever_the_replicas(tmp_path):
    # Two webhook replicas share the state_dir, so both report the circuit (1 from t=30s).
    replicas = [series("hangwatch_webhook_circuit_open", {**WEBHOOK, "instance": f"webhook-{i}:9878",
                                                         "target": "vllm"}, "0 0 1x12") for i in (1, 2)]
    other = series("hangwatch_webhook_circuit_open", {**WEBHOOK, "target": "vllm-b"}, "0x14")
    firing = [expected("HangwatchWebhookCircuitOpen", {"job": "hangwatch_webhook", "target": "vllm"})]
    run(tmp_path, "circuit_open", replicas + [other], [
        {"eval_time": "27s", "alertname": "HangwatchWebhookCircuitOpen", "exp_alerts": []},
        {"eval_time": "87s", "alertname": "HangwatchWebhookCircuitOpen", "exp_alerts": []},   # 57 s open
        {"eval_time": "90s", "alertname": "HangwatchWebhookCircuitOpen", "exp_alerts": firing},  # 60 s open
        {"eval_time": "180s", "alertname": "HangwatchWebhookCircuitOpen", "exp_alerts": firing},
    ])


def test_circuit_open_for_less_than_a_minute_or_closed_does_not_fire(tmp_path):
    # Open for 45 s, then reset by an operator; a second target's circuit never opens.
    reset = series("hangwatch_webhook_circuit_open", {**WEBHOOK, "target": "vllm"}, "0 1 1 1 0x10")
    closed = series("hangwatch_webhook_circuit_open", {**WEBHOOK, "target": "vllm-b"}, "0x14")
    run(tmp_path, "circuit_reset", [reset, closed], [
        {"eval_time": f"{t}s", "alertname": "HangwatchWebhookCircuitOpen", "exp_alerts": []}
        for t in (30, 60, 90, 120, 180)])


def test_exporter_down_covers_the_webhooks_scrape_job(tmp_path):
    webhook_up = series("up", WEBHOOK, "1 1 0x12")       # the webhook stops answering at t=30s
    exporter_up = series("up", {"job": "hangwatch_exporter", "instance": "exporter:9877"}, "1x14")
    down = [expected("HangwatchExporterDown", dict(WEBHOOK))]
    run(tmp_path, "webhook_down", [webhook_up, exporter_up], [
        {"eval_time": "147s", "alertname": "HangwatchExporterDown", "exp_alerts": []},   # 117 s down
        {"eval_time": "150s", "alertname": "HangwatchExporterDown", "exp_alerts": down},  # 120 s down
    ])


def test_a_webhook_that_answers_is_no_alert(tmp_path):
    run(tmp_path, "webhook_up", [series("up", WEBHOOK, "1x14"),
                                 series("hangwatch_webhook_circuit_open", {**WEBHOOK, "target": "vllm"}, "0x14")], [
        {"eval_time": f"{t}s", "alertname": name, "exp_alerts": []}
        for t in (60, 150, 200) for name in ("HangwatchExporterDown", "HangwatchWebhookCircuitOpen")])


WITHHELD = "HangwatchRestartWithheld"


def test_a_withheld_restart_fires_at_once_once_per_target_and_outlasts_a_repeat_interval(tmp_path):
    # Two replicas share the ledger; one of them withheld vllm's restart at t=30s (group limit).
    # Every series starts at 0: the webhook presets them, so the first withheld restart is an increase.
    labels = {"target": "vllm", "group": "llama-70b", "limit": "group"}
    withheld = [series("hangwatch_webhook_restarts_withheld_total", {**WEBHOOK, **labels}, "0 0 1x100"),
                series("hangwatch_webhook_restarts_withheld_total",
                       {**WEBHOOK, "instance": "webhook-2:9878", **labels}, "0x102")]
    never = series("hangwatch_webhook_restarts_withheld_total",
                   {**WEBHOOK, "target": "vllm-b", "group": "llama-70b", "limit": "fleet"}, "0x102")
    firing = [expected(WITHHELD, labels)]
    run(tmp_path, "withheld", withheld + [never], [
        {"eval_time": "27s", "alertname": WITHHELD, "exp_alerts": []},
        {"eval_time": "33s", "alertname": WITHHELD, "exp_alerts": firing},      # no for: people hear at once
        {"eval_time": "16m", "alertname": WITHHELD, "exp_alerts": firing},      # past a 15m repeat_interval
        {"eval_time": "21m", "alertname": WITHHELD, "exp_alerts": []},          # the window has passed
    ])
