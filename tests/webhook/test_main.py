"""``hangwatch webhook`` as a process: serves, honours --dry-run, stops cleanly on SIGTERM."""
import json

import requests

from .real_parts import WebhookProcess


def test_webhook_process_serves_healthz_metrics_and_dry_run_then_stops(tmp_path):
    token = tmp_path / "token"
    token.write_text("proc-token-0123456789-0123456789-abc\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    process = WebhookProcess(config, tmp_path / "webhook.log", "--dry-run")
    try:
        assert requests.get(process.url + "/healthz", timeout=5).json()["dry_run"] is True
        assert requests.post(process.url + "/alerts", json={}, timeout=5).status_code == 401
        body = {"version": "4", "alerts": [{"status": "resolved", "labels": {"target": "vllm-a"}}]}
        answer = requests.post(process.url + "/alerts", json=body, timeout=5,
                               headers={"Authorization": "Bearer proc-token-0123456789-0123456789-abc"})
        assert answer.status_code == 200
        assert 'hangwatch_webhook_requests_total{code="401"} 1.0' in requests.get(process.url + "/metrics", timeout=5).text
    finally:
        process.stop()
    assert process.process.returncode == 0
    log = process.log()
    assert "dry_run=true" in log and "proc-token" not in log
    assert "target=vllm-a container=- action=skip reason=resolved" in log
