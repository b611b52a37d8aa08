"""One webhook, two real Docker hosts: this machine's, and a second dockerd reached over
TCP with TLS client certificates (made here with openssl), as a remote GPU box would be.

The webhook is the real ``hangwatch webhook`` process: its config names the second Docker host
in ``docker_hosts`` with the TLS files, and it builds one Docker SDK client per host. The
containers on the two Docker hosts have *the same name*, so restarting the right name on the
wrong host would show; restarts are counted from each host's own event stream, and each
incident's log tail must come from the container on its target's host. The re-checks are
the real verdict core reading each container's fake vLLM over loopback.

Also here: an ``ssh://`` host through a real OpenSSH server (``sshd.py``), and the group
limit held by two real webhook replicas sharing a state_dir.
"""
from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import requests

from hangwatch.demo.files import private_file

from .certs import make_certs
from .real_parts import IMAGE, REAL_TOKEN, Backend, WebhookProcess, ledger, now_rfc3339, wait_for
from .second_docker_host import SecondDockerHost
from .sshd import SSHServer

real = pytest.mark.real


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def host_b(certs, dockerd):
    host = SecondDockerHost(certs)
    yield host
    host.close()


@pytest.fixture
def pair(docker_client, backend_image, host_b, tmp_path):
    """make(mode_here, mode_there): one fake-vLLM container on each engine, both with one name."""
    made = []

    def make(mode_here: str, mode_there: str):
        name = f"hw-test-{uuid.uuid4().hex[:8]}"
        here = Backend(docker_client, backend_image, tmp_path / "backends", name=name)
        made.append(here)
        there = Backend(host_b.client, IMAGE, tmp_path / "backends", name=name)
        made.append(there)
        here.set_mode(mode_here)
        there.set_mode(mode_there)
        return here, there

    yield make
    for item in made:
        item.remove()


def start_webhook(tmp_path, certs, host_b, here, there) -> WebhookProcess:
    token = private_file(tmp_path / "token", REAL_TOKEN + "\n")
    config = {
        "token_file": str(token), "state_dir": str(tmp_path / "state"),
        "recheck": {"interval": "300ms", "timeout": "1s"},
        "docker_hosts": {"gpu-2": {"url": host_b.url, "tls": certs.tls()}},
        "targets": [
            {"name": "here", "container": here.name, "url": here.url, "stop_timeout": "5s"},
            {"name": "there", "container": there.name, "url": there.url, "stop_timeout": "5s", "docker_host": "gpu-2"},
        ],
    }
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps(config))
    # Many machines point requests at the system's CA bundle; the Docker host's CA is the config's
    # ca_file all the same (before: every call to the TLS host failed certificate verification).
    bundle = str(certs.other_ca)
    return WebhookProcess(path, tmp_path / "webhook.log", env={"REQUESTS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle})


def send(webhook: WebhookProcess, target: str, container: str) -> requests.Response:
    body = {"version": "4", "status": "firing", "receiver": "hangwatch", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093", "groupKey": "{}", "truncatedAlerts": 0,
            "alerts": [{"status": "firing", "labels": {"alertname": "HangwatchBackendHung", "target": target,
                                                       "container": container, "severity": "critical",
                                                       "action": "restart"},
                        "annotations": {}, "startsAt": now_rfc3339(), "endsAt": "0001-01-01T00:00:00Z",
                        "generatorURL": "", "fingerprint": "0"}]}
    return requests.post(webhook.url + "/alerts", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {REAL_TOKEN}"})


def decisions(tmp_path) -> list[tuple]:
    return [(d["target"], d["docker_host"], d["reason"], d.get("result"))
            for d in ledger(tmp_path / "state") if d["event"] == "decision"]


def wait_decisions(tmp_path, count: int, timeout: float = 60) -> list[tuple]:
    wait_for(lambda: len(decisions(tmp_path)) >= count, timeout, f"{count} decisions in the ledger")
    return decisions(tmp_path)


def incidents(tmp_path) -> dict[str, dict]:
    return {record["target"]: record for record in
            (json.loads(p.read_text()) for p in (tmp_path / "state" / "incidents").glob("*.json"))}


@real
def test_a_hang_alert_restarts_exactly_the_right_container_on_the_right_host(tmp_path, certs, host_b, pair):
    here, there = pair("hung", "hung")
    assert here.name == there.name and here.port != there.port
    here_started, there_started = here.started_at(), there.started_at()
    webhook = start_webhook(tmp_path, certs, host_b, here, there)
    try:
        answer = send(webhook, "there", there.name)
        assert answer.status_code == 200 and answer.json()["queued"] == ["there"]
        assert wait_decisions(tmp_path, 1) == [("there", "gpu-2", "hung", "ok")]
        assert (here.restarts(), there.restarts()) == (0, 1)  # the TLS host's container, not the local one
        assert here.started_at() == here_started and there.started_at() != there_started
        there.wait_ready()

        answer = send(webhook, "here", here.name)
        assert answer.status_code == 200 and answer.json()["queued"] == ["here"]
        assert wait_decisions(tmp_path, 2)[1] == ("here", "default", "hung", "ok")
        assert (here.restarts(), there.restarts()) == (1, 1)
    finally:
        webhook.stop()
    assert webhook.process.returncode == 0, webhook.log()
    records = incidents(tmp_path)
    assert records["there"]["docker_host"] == "gpu-2" and records["here"]["docker_host"] == "default"
    # each log tail was read from its own host's container: the fake backend logs its own port
    assert any(f"127.0.0.1:{there.port}" in line for line in records["there"]["logs"])
    assert not any(f"127.0.0.1:{here.port}" in line for line in records["there"]["logs"])
    assert any(f"127.0.0.1:{here.port}" in line for line in records["here"]["logs"])
    assert "PRIVATE KEY" not in webhook.log()


@real
def test_a_busy_backend_on_the_tls_host_is_left_alone_while_the_hung_one_is_restarted(tmp_path, certs, host_b, pair):
    here, there = pair("hung", "busy")
    webhook = start_webhook(tmp_path, certs, host_b, here, there)
    try:
        assert send(webhook, "there", there.name).status_code == 200
        assert send(webhook, "here", here.name).status_code == 200
        seen = sorted(wait_decisions(tmp_path, 2))
    finally:
        webhook.stop()
    assert seen == [("here", "default", "hung", "ok"), ("there", "gpu-2", "recheck_busy", None)]
    assert (here.restarts(), there.restarts()) == (1, 0)


@real
def test_an_unreachable_host_is_503_for_its_own_target_only(tmp_path, certs, host_b, pair):
    """Frozen (SIGSTOP: connections accepted, nothing answers) and then stopped (connection
    refused): each time the TLS host's target gets 503 within a second, repeatedly, and the
    local target is answered and restarted as if nothing were wrong."""
    here, there = pair("hung", "hung")
    webhook = start_webhook(tmp_path, certs, host_b, here, there)
    try:
        host_b.freeze()
        try:
            for _ in range(4):  # more than the host's lookup threads: its calls pile up, only there
                started = time.monotonic()
                answer = send(webhook, "there", there.name)
                assert answer.status_code == 503, answer.text
                assert answer.json()["unreachable"] == ["there"] and time.monotonic() - started < 2.5
            started = time.monotonic()
            answer = send(webhook, "here", here.name)
            took = time.monotonic() - started
            assert answer.status_code == 200 and answer.json()["queued"] == ["here"]
            assert took < 1.5, f"the local target's alert took {took:.1f}s while the other host hung"
            wait_for(lambda: ("here", "default", "hung", "ok") in decisions(tmp_path), 60, "the local restart")
            assert here.restarts() == 1
        finally:
            host_b.thaw()
        assert there.restarts() == 0
        host_b.stop()
        started = time.monotonic()
        answer = send(webhook, "there", there.name)
        assert answer.status_code == 503 and time.monotonic() - started < 2.5
        assert send(webhook, "here", here.name).status_code == 200  # queued; its cooldown answers
        wait_for(lambda: ("here", "default", "cooldown", None) in decisions(tmp_path), 30, "the local cooldown")
    finally:
        webhook.stop()
    assert webhook.process.returncode == 0, webhook.log()
    seen = decisions(tmp_path)
    assert [d for d in seen if d[0] == "there"] == [("there", "gpu-2", "docker_unreachable", None)] * 5
    assert [d for d in seen if d[0] == "here"] == [("here", "default", "hung", "ok"),
                                                   ("here", "default", "cooldown", None)]
    assert here.restarts() == 1


@pytest.fixture
def ssh_server():
    server = SSHServer()
    yield server
    server.close()


@real
def test_a_target_behind_ssh_is_restarted_through_the_sdks_ssh_transport(tmp_path, backend, ssh_server):
    """A real sshd on 127.0.0.1 whose key may only run `docker system dial-stdio` (to this
    machine's Docker host). With a known_hosts that holds another key for the server, the webhook
    refuses the host (503, nothing restarted); with the right one, the hung container is
    restarted through SSH."""
    hung = backend("hung")
    token = private_file(tmp_path / "token", REAL_TOKEN + "\n")
    config = {"token_file": str(token), "state_dir": str(tmp_path / "state"),
              "recheck": {"interval": "300ms", "timeout": "1s"},
              "docker_hosts": {"box": {"url": ssh_server.url}},
              "targets": [{"name": "far", "container": hung.name, "url": hung.url, "stop_timeout": "5s",
                           "docker_host": "box"}]}
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps(config))
    impostor = WebhookProcess(path, tmp_path / "impostor.log", env={"HOME": str(ssh_server.impostor_home()),
                                                                    "SSH_AUTH_SOCK": ""})
    try:
        answer = send(impostor, "far", hung.name)
        assert answer.status_code == 503 and answer.json()["unreachable"] == ["far"], answer.text
    finally:
        impostor.stop()
    assert decisions(tmp_path) == [("far", "box", "docker_unreachable", None)]
    refused = next(d for d in ledger(tmp_path / "state") if d["event"] == "decision")
    assert refused["detail"].startswith("docker host box: BadHostKeyException: Host key for server '127.0.0.1' does not match")
    assert hung.restarts() == 0

    webhook = WebhookProcess(path, tmp_path / "webhook.log", env={"HOME": str(ssh_server.home), "SSH_AUTH_SOCK": ""})
    try:
        # As Alertmanager does: a 503 is retried. The first look-up opens the SSH connection,
        # which on a loaded machine can outlast the request's 0.8 s Docker deadline (measured in
        # CI: "no answer within 0.8s"); it finishes in the host's thread and the retry finds it.
        for attempt in range(5):
            answer = send(webhook, "far", hung.name)
            if answer.status_code != 503:
                break
            time.sleep(2)
        assert answer.status_code == 200 and answer.json()["queued"] == ["far"], answer.text
        retried = wait_decisions(tmp_path, 2 + attempt)[1:]
        assert retried[-1] == ("far", "box", "hung", "ok"), retried
        assert all(d == ("far", "box", "docker_unreachable", None) for d in retried[:-1]), retried
    finally:
        webhook.stop()
    assert webhook.process.returncode == 0, webhook.log()
    assert hung.restarts() == 1
    assert "Accepted publickey for root" in ssh_server.log()
    assert any(f"127.0.0.1:{hung.port}" in line for line in incidents(tmp_path)["far"]["logs"])


@real
def test_two_replicas_hold_the_group_limit_against_a_shared_incident(tmp_path, backend):
    """Two replicas of one model hang together; each webhook replica (real processes sharing
    a state_dir) gets the alert of a different one at the same moment: exactly one container
    is restarted, the other is left to people (group_limit), whichever replica decided it."""
    first, second = backend("hung"), backend("hung")
    token = private_file(tmp_path / "token", REAL_TOKEN + "\n")
    config = {"token_file": str(token), "state_dir": str(tmp_path / "state"),
              "recheck": {"interval": "300ms", "timeout": "1s"}, "group_limit": 1,
              "targets": [{"name": b.name, "container": b.name, "url": b.url, "stop_timeout": "5s",
                           "group": "qwen"} for b in (first, second)]}
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps(config))
    replicas = [WebhookProcess(path, tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        codes = []
        threads = [threading.Thread(target=lambda r=r, b=b: codes.append(send(r, b.name, b.name).status_code))
                   for r, b in zip(replicas, (first, second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert codes == [200, 200]
        seen = wait_decisions(tmp_path, 2)
    finally:
        for replica in replicas:
            replica.stop()
    assert sorted(reason for _, _, reason, _ in seen) == ["group_limit", "hung"]
    assert sorted((first.restarts(), second.restarts())) == [0, 1]
    left = next(target for target, _, reason, _ in seen if reason == "group_limit")
    log = "".join(r.log() for r in replicas)
    assert f"target={left}" in log and "reason=group_limit" in log and "ERROR" in log
