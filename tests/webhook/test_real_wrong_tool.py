"""The signature catalogue and the escalation against the real dockerd.

One stub container per catalogue row (the fake vLLM, hung, that printed the row's example line
once it listened), all started together and alerted in one payload: the webhook reads each one's
real Docker log before deciding, and its decision, ledger and incident name the class and the
policy taken — a ``hardware`` row is not restarted (people told, once), every ``restart`` row is
(Docker's own restart events count). Then the escalation: the circuit opens after the budget and
the command runs once with the incident; a hanging command is killed at its deadline and recorded;
nothing is restarted for it.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from hangwatch.forensics.logsignatures import LOG_SIGNATURES
from hangwatch.incidents import summaries
from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import parse_config
from hangwatch.webhook.restarter import DockerRestarter

from .real_parts import REAL_TOKEN, Backend, alert_body, ledger, now_rfc3339, private_file, wait_for

real = pytest.mark.real


def config(tmp_path, backends, **extra):
    token = private_file(tmp_path / "token", REAL_TOKEN + "\n")
    return parse_config({
        "token_file": str(token), "state_dir": str(tmp_path / "state"),
        "recheck": {"interval": "300ms", "timeout": "1s"}, "cooldown": "0s",
        "budget": {"restarts": 3, "window": "1h"},
        "targets": [{"name": b.name, "container": b.name, "url": b.url, "stop_timeout": "2s"} for b in backends]}
        | extra)


def post(app, alerts):
    body = alert_body(alerts[0][0], alerts[0][1])
    body["alerts"] = [alert_body(b, starts)["alerts"][0] for b, starts in alerts]
    answer = app.test_client().post("/alerts", json=body, headers={"Authorization": f"Bearer {REAL_TOKEN}"})
    assert answer.status_code == 200, answer.get_data(as_text=True)


@pytest.fixture(scope="module")
def catalogue_run(docker_client, backend_image, tmp_path_factory):
    """Every row's container, alerted once (all in parallel), then once more: (backends by row, state dir)."""
    tmp_path = tmp_path_factory.mktemp("catalogue")
    backends = {row.name: Backend(docker_client, backend_image, tmp_path / "backends", say=row.example, wait=False)
                for row in LOG_SIGNATURES}
    try:
        for b in backends.values():
            b.wait_ready()
        app = create_app(config(tmp_path, backends.values()), token=REAL_TOKEN,
                         restarter=DockerRestarter(docker_client))
        state = app.extensions["hangwatch"]
        began = time.monotonic()
        post(app, [(b, now_rfc3339()) for b in backends.values()])
        assert state.wait_idle(60)
        print(f"{len(backends)} rows decided in {time.monotonic() - began:.1f}s")
        # Alertmanager re-sends for the processes left hung (the alert_only ones): counted, not told again
        post(app, [(backends[row.name], now_rfc3339()) for row in LOG_SIGNATURES if row.policy == "alert_only"])
        assert state.wait_idle(60)
        state.close()
        # Docker's own restart events, for every row's container in one query (each query waits until `until`)
        events = docker_client.events(since=min(b.created for b in backends.values()), until=int(time.time()) + 1,
                                      decode=True, filters={"event": "restart"})
        restarted = Counter(e["Actor"]["Attributes"].get("name") for e in events)
        yield backends, tmp_path / "state", restarted
    finally:
        for b in backends.values():
            b.remove()


@real
@pytest.mark.parametrize("row", LOG_SIGNATURES, ids=lambda r: r.name)
def test_each_catalogue_row_is_read_from_the_real_log_and_its_policy_followed(catalogue_run, row):
    backends, state_dir, restarted = catalogue_run
    b = backends[row.name]
    records = [r for r in ledger(state_dir) if r.get("target") == b.name]
    decisions = [r for r in records if r["event"] == "decision"]
    first = decisions[0]
    assert (first["class"], first["policy"], first["log_signature"]) == (row.klass, row.policy, row.name)
    assert row.example in first["line"]
    [incident] = [s for s in summaries(str(state_dir)) if s.target == b.name]
    assert (incident.klass, incident.policy, incident.signature) == (row.klass, row.policy, row.name)
    record = json.loads((state_dir / "incidents" / f"{incident.id}.json").read_text())
    assert record["log_signature"]["line"] == row.example
    if row.policy == "alert_only":
        assert restarted[b.name] == 0
        assert [(d["action"], d["reason"]) for d in decisions] == [("skip", "alert_only")] * 2
        assert [r["key"] for r in records if r["event"] == "alert_only"] == [f"{record['container_id']}@"
                                                                             f"{record['container_started_at']}"]
    else:
        assert restarted[b.name] == 1
        assert [(d["action"], d["reason"]) for d in decisions] == [("restart", "hung")]
        assert [r["event"] for r in records if r["event"] == "restart"] == ["restart"]


def recorder(tmp_path, body: str = "") -> list[str]:
    out = tmp_path / "escalated.jsonl"
    script = tmp_path / "escalate.py"
    script.write_text("import json, os, sys\n"
                      f"record = {{'incident': json.load(sys.stdin), 'reason': os.environ['HANGWATCH_REASON']}}\n"
                      f"open({str(out)!r}, 'a').write(json.dumps(record) + '\\n')\n{body}")
    return [sys.executable, str(script)]


def escalated(tmp_path) -> list[dict]:
    path = tmp_path / "escalated.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@real
def test_the_circuit_opens_after_the_budget_and_escalates_once(tmp_path, docker_client, backend):
    hung = backend("hung")
    app = create_app(config(tmp_path, [hung], budget={"restarts": 2, "window": "1h"},
                            escalate={"command": recorder(tmp_path), "timeout": "10s"}),
                     token=REAL_TOKEN, restarter=DockerRestarter(docker_client))
    state = app.extensions["hangwatch"]
    for _ in range(4):
        hung.wait_ready()
        post(app, [(hung, now_rfc3339())])
        assert state.wait_idle(60)
    state.close()
    assert hung.restarts() == 2
    [run] = escalated(tmp_path)
    assert run["reason"] == "circuit_open" and run["incident"]["container"] == hung.name
    assert pathlib.Path(run["incident"]["incident"]).exists()
    reasons = [(r["action"], r["reason"]) for r in ledger(tmp_path / "state") if r["event"] == "decision"]
    assert reasons == [("restart", "hung"), ("restart", "hung"), ("skip", "circuit_open"), ("skip", "circuit_open")]
    assert [r["outcome"] for r in ledger(tmp_path / "state") if r["event"] == "escalation"] == ["started", "ok"]


@real
def test_a_hanging_escalation_is_killed_at_its_deadline_and_nothing_restarts(tmp_path, docker_client, backend):
    gpu = next(r for r in LOG_SIGNATURES if r.klass == "hardware")
    hung = backend("hung", say=gpu.example)
    app = create_app(config(tmp_path, [hung], escalate={"command": recorder(tmp_path, "import time\ntime.sleep(600)\n"),
                                                        "timeout": "2s"}),
                     token=REAL_TOKEN, restarter=DockerRestarter(docker_client))
    state = app.extensions["hangwatch"]
    began = time.monotonic()
    post(app, [(hung, now_rfc3339())])
    assert state.wait_idle(60)
    took = time.monotonic() - began
    state.close()
    assert took < 20, took
    assert hung.restarts() == 0
    [run] = escalated(tmp_path)  # it ran (read the incident), then hung until killed
    assert run["reason"] == "alert_only" and run["incident"]["class"] == "hardware"
    outcomes = [r for r in ledger(tmp_path / "state") if r["event"] == "escalation"]
    assert [r["outcome"] for r in outcomes] == ["started", "timeout"] and 1.5 < outcomes[-1]["seconds"] < 10


@real
def test_a_startup_that_never_opens_its_port_is_restarted_once_then_alerted_only(tmp_path, docker_client,
                                                                                  backend_image):
    stuck = Backend(docker_client, backend_image, tmp_path / "backends", never_listen=True)
    try:
        targets = [{"name": stuck.name, "container": stuck.name, "url": stuck.url, "stop_timeout": "1s",
                    "startup_deadline": "2s"}]
        app = create_app(config(tmp_path, [stuck], targets=targets), token=REAL_TOKEN,
                         restarter=DockerRestarter(docker_client))
        state = app.extensions["hangwatch"]
        body = alert_body(stuck)
        body["alerts"][0]["labels"]["alertname"] = "HangwatchBackendDown"

        def up_past_deadline():
            started = datetime.fromisoformat(stuck.started_at().replace("Z", "+00:00")[:26] + "+00:00")
            return (datetime.now(timezone.utc) - started).total_seconds() > 2.5

        sent = []
        for _ in range(2):  # the first: restarted; the second, about the process it started: alert only
            wait_for(up_past_deadline, 30, f"{stuck.name} up past its startup_deadline")
            answer = app.test_client().post("/alerts", json=body, headers={"Authorization": f"Bearer {REAL_TOKEN}"})
            assert answer.status_code == 200
            assert state.wait_idle(60)
            sent.append(stuck.restarts())
        state.close()
        assert sent == [1, 1]
        decisions = [(r["action"], r["reason"], r.get("class")) for r in ledger(tmp_path / "state")
                     if r["event"] == "decision"]
        assert decisions == [("restart", "startup_stuck", "unknown"), ("skip", "alert_only", "startup")]
        [alerted] = [s for s in summaries(str(tmp_path / "state")) if s.action == "alert_only"]
        assert (alerted.signature, alerted.klass) == ("startup_stuck", "startup")
    finally:
        stuck.remove()
