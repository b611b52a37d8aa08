"""The webhook against a real Docker engine and real containers running a fake vLLM.

The re-check is the real verdict core (``hangwatch.check.check``) reading the container's
/metrics over loopback; the restarts are real ``docker restart``s, counted from Docker's own
event stream. Decisions exercised: restart (hung), already_restarted (re-sent alert),
duplicate (coalesced), recheck_busy, circuit_open, two replica processes → one restart,
and 503 when the engine is unreachable.
"""
import json
import threading

import docker
import pytest
import requests

from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import load_config, load_token

from .fakes import payload, alert, iso
from .real_parts import WebhookProcess, alert_body, ledger, wait_for, webhook_config

real = pytest.mark.real


def make_app(tmp_path, client, backends, **kwargs):
    path = webhook_config(tmp_path, backends, **kwargs)
    config = load_config(str(path))
    app = create_app(config, token=load_token(config), docker_client=client)
    return app, config


def post(app, body):
    return app.test_client().post("/alerts", json=body, headers={"Authorization": "Bearer real-test-token-0123456789"})


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
            r.url + "/alerts", json=body, headers={"Authorization": "Bearer real-test-token-0123456789"},
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


def test_docker_engine_unreachable_is_503(tmp_path):
    """Not marked real: the point is that there is no engine behind the socket."""
    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-such-docker.sock", version="1.41", timeout=2)
    config_path = tmp_path / "webhook.yml"
    config_path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    config = load_config(str(config_path))
    app = create_app(config, token="t0ken", docker_client=client)
    response = app.test_client().post("/alerts", json=payload(alert(starts_at=iso(0))),
                                      headers={"Authorization": "Bearer t0ken"})
    assert response.status_code == 503
    assert decisions(config) == [("skip", "docker_unreachable")]
    app.extensions["hangwatch"].close()
