"""The alerts name the last restart's forensics signature, read with a ``query`` template from the
webhook's ``hangwatch_webhook_last_restart_timestamp_seconds{target, signature}``, through
``promtool test rules``: HangwatchBackendRestarted (whose resolve, minutes after the restart, is
sure to carry it) and HangwatchBackendHung (whose resolve carries it when Prometheus scraped the
webhook after the capture and before the hang's last evaluation; docs/runbook.md)."""
from __future__ import annotations

from .test_webhook_alerts import WEBHOOK, rule, run, series

BACKEND = {"job": "hangwatch", "instance": "http://vllm-a:8000", "target": "vllm-a", "container": "vllm-a"}
STATE = "target:hangwatch_backend_state:current"
LAST = "hangwatch_webhook_last_restart_timestamp_seconds"
SENTENCE = (" hangwatch last restarted it at 1970-01-01 00:01:00 +0000 UTC; the stacks taken before that "
            "restart read: {signature}.")
HUNG_TEXT = ("vllm-a (container vllm-a) is hung: requests in flight and no engine progress across two scrape "
             "intervals, or its 1-token idle probe failed twice in a row, or it accepted connections without "
             "answering twice in a row. The hangwatch webhook re-checks it and restarts the container.")
RESTARTED_TEXT = ("The process behind vllm-a (container vllm-a) changed: its start time changed, or its counters "
                  "went backwards. hangwatch compares no counters across the two processes.")


def alert(name: str, text: str, **extra) -> dict:
    item = rule(name)
    summary = item["annotations"]["summary"].replace("{{ $labels.target }}", "vllm-a")
    return {"exp_labels": {**BACKEND, **item["labels"], **extra},
            "exp_annotations": {"summary": summary, "description": text,
                                "runbook_url": item["annotations"]["runbook_url"]}}


def test_the_restarted_alert_names_the_signature_of_the_last_restart(tmp_path):
    restarted = series(STATE, {**BACKEND, "state": "restarted"}, "0 1 0x20")
    # Two webhook replicas: the one that restarted last (at 60 s) names the signature.
    last = [series(LAST, {**WEBHOOK, "instance": "webhook-1:9878", "target": "vllm-a",
                          "signature": "engine_step_stuck"}, "60x21"),
            series(LAST, {**WEBHOOK, "instance": "webhook-2:9878", "target": "vllm-a",
                          "signature": "process_stopped"}, "30x21"),
            series(LAST, {**WEBHOOK, "target": "vllm-b", "signature": "collective_wait"}, "90x21")]
    run(tmp_path, "restarted_signature", [restarted, *last], [
        {"eval_time": "90s", "alertname": "HangwatchBackendRestarted", "exp_alerts": [
            alert("HangwatchBackendRestarted", RESTARTED_TEXT + SENTENCE.format(signature="engine_step_stuck"))]},
    ])


def test_the_hung_alert_names_it_once_the_webhook_exports_it_and_says_nothing_before(tmp_path):
    hung = series(STATE, {**BACKEND, "state": "hung"}, "1x8")
    # The webhook's series appears at 60 s (a restart at t=60 s): before it, no sentence at all.
    last = series(LAST, {**WEBHOOK, "target": "vllm-a", "signature": "engine_step_stuck"}, "_x4 60x4")
    run(tmp_path, "hung_signature", [hung, last], [
        {"eval_time": "33s", "alertname": "HangwatchBackendHung", "exp_alerts": [
            alert("HangwatchBackendHung", HUNG_TEXT)]},
        {"eval_time": "78s", "alertname": "HangwatchBackendHung", "exp_alerts": [
            alert("HangwatchBackendHung", HUNG_TEXT + SENTENCE.format(signature="engine_step_stuck"))]},
    ])


def test_the_webhook_restarted_alert_carries_the_signature_as_a_label_for_ten_minutes(tmp_path):
    """A label, so the resolve carries it too; active from the first evaluation that sees the
    webhook's series until 40 scrapes (10 minutes at 15 s) after the restart."""
    last = series(LAST, {**WEBHOOK, "target": "vllm-a", "signature": "engine_step_stuck"}, "_x3 60x60")
    older = series(LAST, {**WEBHOOK, "target": "vllm-b", "signature": "none"}, "-1000x63")  # long ago
    firing = {"exp_labels": {"target": "vllm-a", "signature": "engine_step_stuck", "severity": "info"},
              "exp_annotations": {
                  "summary": "hangwatch restarted vllm-a; its stacks read engine_step_stuck",
                  "description": "The hangwatch webhook restarted vllm-a at 1970-01-01 00:01:00 +0000 UTC after its "
                                 "own re-check. The stacks taken before the restart read engine_step_stuck (none: no "
                                 "capture; forensics_url not set or nothing captured): `hangwatch incidents` lists "
                                 "the incident with its evidence and stacks.",
                  "runbook_url": rule("HangwatchWebhookRestarted")["annotations"]["runbook_url"]}}
    run(tmp_path, "webhook_restarted", [last, older], [
        {"eval_time": "27s", "alertname": "HangwatchWebhookRestarted", "exp_alerts": []},
        {"eval_time": "63s", "alertname": "HangwatchWebhookRestarted", "exp_alerts": [firing]},
        {"eval_time": "657s", "alertname": "HangwatchWebhookRestarted", "exp_alerts": [firing]},
        {"eval_time": "663s", "alertname": "HangwatchWebhookRestarted", "exp_alerts": []},
    ])
