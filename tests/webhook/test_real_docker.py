"""The webhook against a real Docker host and real containers running a fake vLLM.

The re-check is the real verdict core (``hangwatch.check.check``) reading the container's
/metrics over loopback; the restarts are real ``docker restart``s by ``DockerRestarter``,
counted from Docker's own event stream. Decisions exercised: restart (hung),
already_restarted (re-sent alert), duplicate (coalesced), recheck_busy, circuit_open, two
replica processes → one restart, 503 when Docker is unreachable, a configured name that
is only another container's ID prefix, the restarter through the compose file's socket-proxy
allowlist, and SIGTERM in the middle of a restart.
"""
import json
import signal
import threading
import time

import docker
import pytest
import requests

from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import load_config, load_token
from hangwatch.webhook.restarter import DockerRestarter

from .fakes import alert, iso, payload
from .real_parts import REAL_TOKEN, WebhookProcess, alert_body, ledger, wait_for, webhook_config

real = pytest.mark.real


def make_app(tmp_path, client, backends, **kwargs):
    path = webhook_config(tmp_path, backends, **kwargs)
    config = load_config(str(path))
    app = create_app(config, token=load_token(config), restarter=DockerRestarter(client))
    return app, config


def post(app, body):
    return app.test_client().post("/alerts", json=body, headers={"Authorization": f"Bearer {REAL_TOKEN}"})


def decisions(config):
    import pathlib
    return [(d["action"], d["reason"]) for d in ledger(pathlib.Path(config.state_dir)) if d["event"] == "decision"]


@real
def test_hung_container_is_restarted_once_and_a_resent_alert_is_not(tmp_path, docker_client, backend):
    hung = backend("hung")
    before = hung.started_at()
    app, config = make_app(tmp_path, docker_client, [hung])
    state = app.extensions["hangwatch"]
    body = alert_body(hung)
    assert post(app, body).status_code == 200
    assert post(app, body).status_code == 200  # a duplicate while the re-check runs: coalesced
    assert state.wait_idle(60)
    assert hung.restarts() == 1 and hung.started_at() != before
    hung.wait_ready()
    assert post(app, body).status_code == 200  # Alertmanager re-sends the same alert later
    assert state.wait_idle(60)
    assert hung.restarts() == 1
    assert decisions(config) == [("skip", "duplicate"), ("restart", "hung"), ("skip", "already_restarted")]
    incident = json.loads(next((tmp_path / "state" / "incidents").glob("*.json")).read_text())
    assert incident["recheck"]["verdict"] == "hung" and incident["recheck"]["readings"] == 3
    assert any("fake backend on 127.0.0.1" in line for line in incident["logs"])
    assert incident["observations"][-1]["reading"]["running"] == 1.0
    state.close()


@real
def test_backend_busy_again_by_recheck_time_is_not_restarted(tmp_path, docker_client, backend):
    busy = backend("busy")
    app, config = make_app(tmp_path, docker_client, [busy])
    assert post(app, alert_body(busy)).status_code == 200
    assert app.extensions["hangwatch"].wait_idle(60)
    assert busy.restarts() == 0
    assert decisions(config) == [("skip", "recheck_busy")]
    app.extensions["hangwatch"].close()


@real
def test_backend_that_stays_hung_gets_at_most_the_budget_then_the_circuit_opens(tmp_path, docker_client, backend):
    hung = backend("hung")
    app, config = make_app(tmp_path, docker_client, [hung], cooldown="0s", restarts=2)
    state = app.extensions["hangwatch"]
    for _ in range(4):  # each time a new alert: it is hung again after every restart
        hung.wait_ready()
        assert post(app, alert_body(hung)).status_code == 200
        assert state.wait_idle(60)
    assert hung.restarts() == 2
    assert decisions(config) == [("restart", "hung"), ("restart", "hung"), ("skip", "circuit_open"),
                                 ("skip", "circuit_open")]
    metrics = app.test_client().get("/metrics").text
    assert f'hangwatch_webhook_circuit_open{{target="{hung.name}"}} 1.0' in metrics
    assert f'hangwatch_webhook_restarts_total{{result="ok",target="{hung.name}"}} 2.0' in metrics
    state.close()


@real
def test_two_webhook_replicas_sharing_state_dir_restart_once(tmp_path, docker_client, backend):
    hung = backend("hung")
    path = webhook_config(tmp_path, [hung])
    replicas = [WebhookProcess(path, tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        body = alert_body(hung)
        answers = []
        threads = [threading.Thread(target=lambda r=r: answers.append(requests.post(
            r.url + "/alerts", json=body, headers={"Authorization": f"Bearer {REAL_TOKEN}"},
            timeout=5).status_code)) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == [200, 200]
        wait_for(lambda: len([d for d in ledger(tmp_path / "state") if d["event"] == "decision"]) == 2,
                 60, "both replicas to decide")
        assert hung.restarts() == 1
        reasons = sorted(d["reason"] for d in ledger(tmp_path / "state") if d["event"] == "decision")
        # The other replica refuses: the container already restarted, or its own re-check
        # caught the restart in progress (port refused: down; a new process: restarted).
        assert reasons[1] == "hung" or reasons[0] == "hung"
        assert set(reasons) - {"hung"} <= {"already_restarted", "cooldown", "recheck_down", "recheck_restarted"}
        assert reasons.count("hung") == 1
        assert len({d["replica"] for d in ledger(tmp_path / "state") if d["event"] == "decision"}) == 2
    finally:
        for replica in replicas:
            replica.stop()
    for replica in replicas:
        assert replica.process.returncode == 0, replica.log()


def test_docker_host_unreachable_is_503(tmp_path):
    """Not marked real: the point is that there is no Docker behind the socket."""
    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-such-docker.sock", version="1.41", timeout=2)
    config_path = tmp_path / "webhook.yml"
    config_path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    config = load_config(str(config_path))
    app = create_app(config, token=REAL_TOKEN, restarter=DockerRestarter(client))
    response = app.test_client().post("/alerts", json=payload(alert(starts_at=iso(0))),
                                      headers={"Authorization": f"Bearer {REAL_TOKEN}"})
    assert response.status_code == 503
    assert decisions(config) == [("skip", "docker_unreachable")]
    app.extensions["hangwatch"].close()


@real
def test_a_configured_name_that_is_only_another_containers_id_prefix_restarts_nothing(tmp_path, docker_client, backend):
    """Before: Docker resolved /containers/<name>/json by ID prefix, and the webhook restarted
    a container nobody configured (here: a hung one whose ID starts with the configured name)."""
    bystander = backend("hung")
    prefix = bystander.container.id[:12]
    app, config = make_app(tmp_path, docker_client, [bystander], containers={bystander.name: prefix})
    body = alert_body(bystander)
    body["alerts"][0]["labels"]["container"] = prefix
    assert post(app, body).status_code == 200
    assert app.extensions["hangwatch"].wait_idle(60)
    assert bystander.restarts() == 0
    assert decisions(config) == [("skip", "container_not_found")]
    app.extensions["hangwatch"].close()


class AllowlistProxy:
    """The compose file's docker-proxy, in miniature: forwards to the real Docker socket only
    what its -allowGET/-allowPOST expressions match (anchored, on the path), 403 otherwise."""

    def __init__(self, allows, socket_path="/var/run/docker.sock"):
        import http.client
        import socket as socketlib
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit
        self.seen, self.refused = [], []
        proxy = self

        class UnixConnection(http.client.HTTPConnection):
            def connect(self):
                self.sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
                self.sock.settimeout(60)
                self.sock.connect(socket_path)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self):
                path = urlsplit(self.path).path
                proxy.seen.append((self.command, path))
                if not allows(self.command, path):
                    proxy.refused.append((self.command, path))
                    self.send_response(403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream = UnixConnection("docker")
                upstream.request(self.command, self.path, body=body or None,
                                 headers={k: v for k, v in self.headers.items() if k.lower() != "connection"})
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = relay

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"tcp://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@real
def test_the_restarter_works_through_the_socket_proxys_allowlist(tmp_path, docker_client, backend):
    from tests.test_compose import proxy_allows
    hung = backend("hung")
    proxy = AllowlistProxy(proxy_allows)
    try:
        client = docker.DockerClient(base_url=proxy.url, version="auto", timeout=30)
        app, config = make_app(tmp_path, client, [hung])
        assert post(app, alert_body(hung)).status_code == 200
        assert app.extensions["hangwatch"].wait_idle(60)
        assert hung.restarts() == 1
        assert decisions(config) == [("restart", "hung")]
        incident = json.loads(next((tmp_path / "state" / "incidents").glob("*.json")).read_text())
        assert any("fake backend on 127.0.0.1" in line for line in incident["logs"])
        assert proxy.refused == [] and {m for m, _ in proxy.seen} == {"GET", "POST"}
        # ... and what it must never let through, on the same live Docker host:
        assert proxy_allows("POST", f"/v1.41/containers/{hung.container.id}/restart")
        assert not proxy_allows("POST", "/v1.41/containers/create")
        assert not proxy_allows("POST", f"/v1.41/containers/{hung.container.id}/exec")
        app.extensions["hangwatch"].close()
        client.close()
    finally:
        proxy.close()


@real
def test_sigterm_in_the_middle_of_a_restart_lets_it_finish(tmp_path, backend):
    """The container ignores SIGTERM, so `docker restart` takes its whole 4 s stop timeout;
    the webhook, stopped in the middle, finishes the restart and records it before exiting."""
    slow = backend("hung", ignore_sigterm=True)
    webhook = WebhookProcess(webhook_config(tmp_path, [slow], stop_timeout="4s"), tmp_path / "webhook.log")
    try:
        answer = requests.post(webhook.url + "/alerts", json=alert_body(slow), timeout=5,
                               headers={"Authorization": f"Bearer {REAL_TOKEN}"})
        assert answer.status_code == 200 and answer.json()["queued"] == [slow.name]
        wait_for(lambda: any(r["event"] == "restart" for r in ledger(tmp_path / "state")), 30,
                 "the restart to begin (its ledger line is written first)")
        stopped_at = time.monotonic()
        webhook.process.send_signal(signal.SIGTERM)
        webhook.process.wait(60)
        took = time.monotonic() - stopped_at
    finally:
        webhook.stop()
    assert webhook.process.returncode == 0, webhook.log()
    assert 1.5 < took < 4 + 35 + 5, f"stopped after {took:.1f}s"
    assert [(d["reason"], d.get("result")) for d in ledger(tmp_path / "state") if d["event"] == "decision"] == [
        ("hung", "ok")]
    assert slow.restarts() == 1
