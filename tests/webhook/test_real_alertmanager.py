"""End to end: a real Alertmanager → ``hangwatch webhook`` (a real process) → a real container.

Alertmanager sends with ``http_config.authorization.credentials_file`` and re-sends every
2 s (``repeat_interval``); the container is restarted exactly once, the re-sends are
skipped (already_restarted), and the resolved notification is skipped as resolved.
"""
import json
import subprocess
import time

import pytest
import requests

from tests.support.require import require_binary

from .real_parts import WebhookProcess, answers, free_port, ledger, now_rfc3339, wait_for, webhook_config


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_binary("prometheus-alertmanager")
    started = []

    def start(webhook_url: str, token_file) -> str:
        port = free_port()
        config = tmp_path / "alertmanager.yml"
        config.write_text(json.dumps({
            "route": {"receiver": "hangwatch", "group_by": ["alertname", "target"], "group_wait": "0s",
                      "group_interval": "1s", "repeat_interval": "2s"},
            "receivers": [{"name": "hangwatch", "webhook_configs": [{
                "url": webhook_url + "/alerts", "send_resolved": True,
                "http_config": {"authorization": {"credentials_file": str(token_file)}}}]}],
        }))
        log = open(tmp_path / "alertmanager.log", "wb")
        process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}",
                                    f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                   stdout=log, stderr=subprocess.STDOUT)
        started.append((process, log))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: process.poll() is not None or answers(url + "/-/ready"), 20, "alertmanager /-/ready")
        assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()
        return url

    yield start
    for process, log in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.mark.real
def test_alertmanager_to_webhook_restarts_the_container_exactly_once(tmp_path, backend, alertmanager):
    hung = backend("hung")
    webhook = WebhookProcess(webhook_config(tmp_path, [hung]), tmp_path / "webhook.log")
    try:
        am = alertmanager(webhook.url, tmp_path / "token")
        labels = {"alertname": "HangwatchBackendHung", "severity": "critical", "action": "restart",
                  "target": hung.name, "container": hung.name}
        posted = requests.post(am + "/api/v2/alerts", json=[{"labels": labels, "startsAt": now_rfc3339()}], timeout=5)
        assert posted.status_code == 200, posted.text
        decided = lambda: [d for d in ledger(tmp_path / "state") if d["event"] == "decision"]
        wait_for(lambda: any(d["reason"] == "hung" for d in decided()), 60, "the webhook to restart", 0.2)
        # Alertmanager keeps re-sending the still-active alert every 2 s; each re-send must be refused.
        wait_for(lambda: sum(d["reason"] in ("already_restarted", "duplicate") for d in decided()) >= 2, 30,
                 "Alertmanager's re-sends to reach the webhook", 0.2)
        assert hung.restarts() == 1
        # An operator (or Prometheus) resolves it: the resolved notification is skipped too.
        requests.post(am + "/api/v2/alerts", json=[{"labels": labels, "startsAt": now_rfc3339(),
                                                    "endsAt": now_rfc3339()}], timeout=5)
        wait_for(lambda: any(d["reason"] == "resolved" for d in decided()), 30, "the resolved notification", 0.2)
        assert webhook.idle()
        assert hung.restarts() == 1
        assert {d["reason"] for d in decided()} <= {"hung", "already_restarted", "duplicate", "resolved"}
        assert "real-test-token" not in webhook.log()
        text = requests.get(webhook.url + "/metrics", timeout=5).text
        assert 'hangwatch_webhook_requests_total{code="401"}' not in text
    finally:
        webhook.stop()
    assert webhook.process.returncode == 0
