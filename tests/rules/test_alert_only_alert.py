"""HangwatchWebhookAlertOnly through ``promtool test rules``: a hang the webhook did not restart
because its class says a restart cannot help reaches people, per target and class, once however
many webhook replicas count it; nothing fires while the counter stands still."""
from __future__ import annotations

from .test_webhook_alerts import WEBHOOK, expected, run, series

COUNTER = "hangwatch_webhook_alert_only_total"


def test_alert_only_fires_for_the_target_and_class_and_not_for_a_still_counter(tmp_path):
    counted = [series(COUNTER, {**WEBHOOK, "instance": f"webhook-{i}:9878", "target": "vllm-a",
                                "class": "hardware"}, "0 0 1x20") for i in (1, 2)]
    still = series(COUNTER, {**WEBHOOK, "target": "vllm-b", "class": "hardware"}, "0x22")
    run(tmp_path, "alert_only", [*counted, still], [
        {"eval_time": "15s", "alertname": "HangwatchWebhookAlertOnly", "exp_alerts": []},
        {"eval_time": "60s", "alertname": "HangwatchWebhookAlertOnly",
         "exp_alerts": [expected("HangwatchWebhookAlertOnly", {"target": "vllm-a", "class": "hardware"})]},
    ])
