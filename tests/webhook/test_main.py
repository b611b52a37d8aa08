"""``hangwatch webhook`` as a process: serves, honours --dry-run, stops cleanly on SIGTERM."""
import json
import signal
import socket
import time

import requests

from hangwatch.demo.files import private_file
from hangwatch.webhook.server import CONNECTION_LIMIT

from .real_parts import WebhookProcess


def test_webhook_process_serves_healthz_metrics_and_dry_run_then_stops(tmp_path):
    token = private_file(tmp_path / "token", "proc-token-0123456789-0123456789-abc\n")
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


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_webhook_process_survives_slow_clients_and_stops_at_once_on_sigterm(tmp_path):
    """Before: 300 half-open connections held 300 threads for as long as the clients liked."""
    token = private_file(tmp_path / "token", "proc-token-0123456789-0123456789-abc\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    process = WebhookProcess(config, tmp_path / "webhook.log", "--dry-run")
    sockets = []
    try:
        idle_threads = threads_of(process.process.pid)
        for _ in range(CONNECTION_LIMIT - 16):  # all held open at once, with room left for the checks
            connection = socket.create_connection(("127.0.0.1", process.port), timeout=5)
            connection.sendall(b"POST /alerts HTTP/1.1\r\nHost: webhook\r\n")
            sockets.append(connection)
        # Answered past the held connections: one held behind them would end at its 5 s timeout.
        assert requests.get(process.url + "/healthz", timeout=5).status_code == 200
        assert requests.get(process.url + "/metrics", timeout=5).status_code == 200
        assert threads_of(process.process.pid) <= idle_threads + 2
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        process.process.wait(10)
        assert time.monotonic() - started < 3, "SIGTERM must stop an idle webhook at once"
    finally:
        for connection in sockets:
            connection.close()
        process.stop()
    assert process.process.returncode == 0
    assert "webhook stopped" in process.log()
