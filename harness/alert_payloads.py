"""Alertmanager's largest notification to the webhook: one group of many HangwatchBackendHung.

The labels and annotations are the shipped rules' (``rules/hangwatch-alerts.yml``) for a
fleet with long names; ``bench/bench_webhook_payload.py`` has a real Alertmanager send the
same alerts and compares its notification's size with ``payload()``'s.
"""
from __future__ import annotations

from urllib.parse import quote_plus

EXPR = ('max without (state) (max_over_time(target:hangwatch_backend_state:current{state="hung"}[7500ms])) == 1\n'
        '  unless on (job, instance)\n'
        'hangwatch_backend_info{module=~"proxy|fastchat_controller|fastchat_api"}\n')
RUNBOOK = "https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md#hangwatchbackendhung"


def target(i: int) -> str:
    return f"llama-3-70b-instruct-{i:04d}"


def alert_labels(i: int) -> dict:
    return {"alertname": "HangwatchBackendHung", "target": target(i), "container": f"vllm-{target(i)}",
            "severity": "critical", "action": "restart", "job": "hangwatch",
            "instance": f"http://gpu-node-{i:04d}.inference.cluster.internal:8000"}


def annotations(i: int) -> dict:
    name = target(i)
    return {"summary": f"LLM backend {name} is hung",
            "description": f"{name} (container vllm-{name}) is hung: requests in flight and no engine progress "
                           "across two scrape intervals, or its 1-token idle probe failed twice in a row, or it "
                           "accepted connections without answering twice in a row. The hangwatch webhook "
                           "re-checks it and restarts the container.",
            "runbook_url": RUNBOOK}


def generator_url() -> str:
    return f"http://prometheus.monitoring.svc:9090/graph?g0.expr={quote_plus(EXPR)}&g0.tab=1"


def payload(count: int, starts_at: str = "2026-12-03T09:00:00.123456789Z") -> dict:
    """A v4 notification of ``count`` firing alerts grouped by ``alertname`` only."""
    alerts = [{"status": "firing", "labels": alert_labels(i), "annotations": annotations(i),
               "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": generator_url(),
               "fingerprint": f"{i:016x}"} for i in range(count)]
    common = {"alertname": "HangwatchBackendHung", "severity": "critical", "action": "restart", "job": "hangwatch"}
    return {"receiver": "hangwatch-webhook", "status": "firing", "alerts": alerts,
            "groupLabels": {"alertname": "HangwatchBackendHung"}, "commonLabels": common,
            "commonAnnotations": {"runbook_url": RUNBOOK}, "externalURL": "http://alertmanager.monitoring.svc:9093",
            "version": "4", "groupKey": '{}/{action="restart"}:{alertname="HangwatchBackendHung"}',
            "truncatedAlerts": 0}
