"""Each decision the webhook can make, with fakes for Docker and the re-check."""
import json
import logging
import threading
import time

from .fakes import FakeRechecker, auth, iso, payload


def reasons(h):
    return [(d["action"], d["reason"]) for d in h.decisions()]


def counted(h, reason, action="skip"):
    """hangwatch_webhook_decisions_total for one reason, from /metrics."""
    prefix = f'hangwatch_webhook_decisions_total{{action="{action}",reason="{reason}"}} '
    line = next(line for line in h.client.get("/metrics").text.splitlines() if line.startswith(prefix))
    return float(line[len(prefix):])


def test_hung_backend_is_restarted_once_with_incident_record(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    h = harness()
    response = h.post(payload(h.alert()))
    assert response.status_code == 200
    assert response.get_json()["queued"] == ["vllm-a"]
    h.settle()
    assert h.restarter.restarts == [("vllm-a", 30)]
    assert reasons(h) == [("restart", "hung")]
    assert h.rechecker.calls == [{"url": "http://127.0.0.1:18000", "module": "backend", "interval": 1.0, "timeout": 1.0,
                                "api_key": None, "probe": "auto"}]
    lines = [r.getMessage() for r in caplog.records if "action=" in r.getMessage()]
    assert lines == [lines[0]] and lines[0].startswith(
        "alertname=HangwatchBackendHung target=vllm-a container=vllm-a action=restart reason=hung")
    incidents = list((h.state_dir / "incidents").glob("*.json"))
    assert len(incidents) == 1
    record = json.loads(incidents[0].read_text())
    assert record["target"] == "vllm-a" and record["recheck"]["verdict"] == "hung"
    assert len(record["observations"]) == 3 and record["observations"][0]["reading"]["running"] == 1
    assert len(record["logs"]) == 100 and record["logs"][-1] == "line 149 of vllm-a"


def test_resent_alert_after_the_restart_is_skipped_as_already_restarted(harness):
    h = harness()
    body = payload(h.alert())
    h.post(body)
    h.settle()
    h.clock.advance(1)
    assert h.post(body).status_code == 200  # Alertmanager re-sends the same alert
    h.settle()
    assert len(h.restarter.restarts) == 1
    assert reasons(h) == [("restart", "hung"), ("skip", "already_restarted")]
    assert len(h.rechecker.calls) == 1  # no re-check needed to refuse


def test_duplicate_alerts_while_a_job_runs_are_coalesced(harness):
    h = harness()
    h.rechecker.gate = threading.Event()
    first = h.post(payload(h.alert()))
    second = h.post(payload(h.alert(), h.alert(alertname="HangwatchBackendHung", severity="page")))
    assert first.get_json()["queued"] == ["vllm-a"] and second.get_json()["queued"] == []
    h.rechecker.gate.set()
    h.settle()
    assert len(h.restarter.restarts) == 1
    assert sorted(reasons(h)) == [("restart", "hung"), ("skip", "duplicate"), ("skip", "duplicate")]


def test_answers_within_one_second_while_the_recheck_runs(harness):
    h = harness()
    h.rechecker.gate = threading.Event()
    started = time.monotonic()
    assert h.post(payload(h.alert(), h.alert(target="vllm-b", container="vllm-b"))).status_code == 200
    # The re-check is held until the test releases it (10 s at most): an answer that waited for it
    # would take that long. A generous bound, well under Alertmanager's webhook timeout.
    assert time.monotonic() - started < 5.0
    assert h.state.worker.in_progress() == 2  # two targets re-checked side by side
    h.rechecker.gate.set()
    h.settle()
    assert sorted(name for name, _ in h.restarter.restarts) == ["vllm-a", "vllm-b"]


def test_backend_busy_again_by_recheck_time_is_not_restarted(harness):
    h = harness(rechecker=FakeRechecker("busy"))
    assert h.post(payload(h.alert())).status_code == 200
    h.settle()
    assert h.restarter.restarts == []
    assert reasons(h) == [("skip", "recheck_busy")]


def test_every_verdict_but_hung_skips(harness, tmp_path):
    for state in ("idle", "busy", "restarted", "blind", "down"):
        h = harness(rechecker=FakeRechecker(state), state_dir=tmp_path / state)
        h.post(payload(h.alert()))
        h.settle()
        assert h.restarter.restarts == [] and reasons(h) == [("skip", f"recheck_{state}")]


def test_recheck_that_raises_skips(harness):
    h = harness(rechecker=FakeRechecker(ValueError("unknown module 'fastchat_worker'")))
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", "recheck_error")]


def test_resolved_alert_is_skipped_without_docker_and_only_counted(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    h = harness()
    for _ in range(3):  # Alertmanager sends a resolved alert at every group interval
        assert h.post(payload(h.alert(status="resolved"))).status_code == 200
    h.settle()
    assert h.restarter.gets == [] and h.restarter.restarts == []
    assert counted(h, "resolved") == 3
    assert sum("action=skip reason=resolved" in r.getMessage() for r in caplog.records) == 3
    assert (h.state_dir / "ledger.jsonl").read_bytes() == b"", "an ignored alert is no ledger line"


def test_unconfigured_alertname_is_skipped(harness):
    h = harness()
    h.post(payload(h.alert(alertname="HangwatchBackendSlow")))
    h.settle()
    assert h.restarter.gets == [] and counted(h, "alertname_ignored") == 1 and reasons(h) == []


def test_unknown_target_and_foreign_container_never_reach_docker(harness):
    h = harness()
    body = payload(h.alert(target="postgres", container="postgres"),
                   h.alert(target="vllm-a", container="postgres"),
                   h.alert(target="vllm-a", container=None),
                   h.alert(target=None))
    assert h.post(body).status_code == 200
    h.settle()
    assert h.restarter.gets == [] and h.restarter.restarts == []
    assert (counted(h, "unknown_target"), counted(h, "container_mismatch"), counted(h, "container_label_missing")) == (
        2, 1, 1)
    assert reasons(h) == []  # ignored: logged and counted, no ledger line


def test_configured_container_missing_in_docker_is_200_and_logged(harness):
    h = harness()
    del h.restarter.by_name["vllm-a"]
    response = h.post(payload(h.alert()))
    assert response.status_code == 200 and response.get_json()["queued"] == []
    h.settle()
    assert reasons(h) == [("skip", "container_not_found")] and h.rechecker.calls == []


def test_docker_unreachable_is_503_so_alertmanager_retries(harness):
    h = harness()
    h.restarter.down = True
    response = h.post(payload(h.alert()))
    assert response.status_code == 503
    assert reasons(h) == [("skip", "docker_unreachable")] and h.rechecker.calls == []


def test_docker_too_slow_is_503_within_a_second(harness):
    h = harness()
    h.restarter.delay = 6.0
    started = time.monotonic()
    assert h.post(payload(h.alert())).status_code == 503
    # Docker's answer would take 6 s: the webhook gives up on it at its own bound (1 s), far before.
    assert time.monotonic() - started < h.restarter.delay / 2


def test_container_restarting_or_stopped_is_skipped(harness):
    h = harness()
    h.restarter.by_name["vllm-a"].attrs["State"].update(Status="restarting", Restarting=True)
    h.restarter.by_name["vllm-b"].attrs["State"].update(Status="exited", Running=False)
    h.post(payload(h.alert(), h.alert(target="vllm-b", container="vllm-b")))
    h.settle()
    assert h.restarter.restarts == [] and h.rechecker.calls == []
    assert reasons(h) == [("skip", "not_running"), ("skip", "not_running")]


def test_cooldown_blocks_a_second_restart_until_it_passes(harness):
    h = harness(budget={"restarts": 10, "window": "1h"})
    h.post(payload(h.alert()))
    h.settle()
    h.clock.advance(600)  # hung again 10 minutes later: a new alert, after the restart
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 1 and reasons(h)[-1] == ("skip", "cooldown")
    h.clock.advance(301)  # 15m after the restart
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 2 and reasons(h)[-1] == ("restart", "hung")


def test_budget_spent_opens_the_circuit_until_reset(harness, caplog):
    h = harness(cooldown="0s", budget={"restarts": 2, "window": "1h"})
    for _ in range(4):
        h.clock.advance(120)
        h.post(payload(h.alert()))
        h.settle()
    assert len(h.restarter.restarts) == 2
    assert [r for _, r in reasons(h)] == ["hung", "hung", "circuit_open", "circuit_open"]
    assert any(r.levelno == logging.ERROR and r.getMessage().startswith("CIRCUIT OPEN target=vllm-a")
               for r in caplog.records)
    metrics = h.client.get("/metrics").text
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 1.0' in metrics
    assert 'hangwatch_webhook_circuit_open{target="vllm-b"} 0.0' in metrics
    assert h.client.post("/circuit/vllm-a/reset").status_code == 401
    assert h.client.post("/circuit/nope/reset", headers=auth()).status_code == 404
    assert h.client.post("/circuit/vllm-a/reset", headers=auth()).status_code == 200
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 0.0' in h.client.get("/metrics").text
    h.clock.advance(120)
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 3


def test_circuit_closes_by_itself_when_the_window_passes(harness):
    h = harness(cooldown="0s", budget={"restarts": 1, "window": "1h"})
    h.post(payload(h.alert()))
    h.settle()
    h.clock.advance(120)
    h.post(payload(h.alert()))
    h.settle()
    assert reasons(h)[-1] == ("skip", "circuit_open")
    h.clock.advance(3600)
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 0.0' in h.client.get("/metrics").text
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 2


def test_restarted_webhook_restores_cooldown_and_budget_from_the_ledger(harness, tmp_path):
    first = harness(cooldown="15m", budget={"restarts": 1, "window": "1h"})
    first.post(payload(first.alert()))
    first.settle()
    first.close()
    first.clock.advance(120)
    second = harness(clock=first.clock, restarter=first.restarter)  # same state_dir, a new process
    second.post(payload(second.alert()))
    second.settle()
    assert len(first.restarter.restarts) == 1
    assert reasons(second)[-1] == ("skip", "cooldown")


def test_two_replicas_sharing_state_dir_restart_once(harness):
    gate = threading.Event()
    one = harness()
    two = harness(clock=one.clock, restarter=one.restarter)  # same state_dir, same Docker host
    for h in (one, two):
        h.rechecker.gate = gate
    body = payload(one.alert())
    assert one.post(body).status_code == 200 and two.post(body).status_code == 200
    gate.set()  # both re-checks say hung at the same moment; both race for the lock
    one.settle()
    two.settle()
    assert len(one.restarter.restarts) == 1
    assert sorted(reasons(one)) == [("restart", "hung"), ("skip", "already_restarted")]


def test_dry_run_logs_the_restart_and_touches_nothing(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    h = harness(dry_run=True)
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == []
    assert not list((h.state_dir / "incidents").glob("*"))
    line = next(r.getMessage() for r in caplog.records if "action=" in r.getMessage())
    assert "action=restart reason=hung dry_run=true" in line
    h.post(payload(h.alert()))  # a dry run spends no budget and starts no cooldown
    h.settle()
    assert reasons(h) == [("restart", "hung"), ("restart", "hung")]
    # Counted per target as what it is, for the dashboard's restart annotation; no "ok" series.
    text = h.client.get("/metrics").text
    assert 'hangwatch_webhook_restarts_total{result="dry_run",target="vllm-a"} 2.0' in text
    assert 'result="ok"' not in text and 'result="failed"' not in text


def test_metrics_and_healthz(harness):
    h = harness()
    h.post(payload(h.alert()))
    h.post({"version": "3"})
    h.post(payload(), headers={})
    h.settle()
    text = h.client.get("/metrics").text
    assert h.client.get("/healthz").get_json()["status"] == "ok"
    for line in ('hangwatch_webhook_requests_total{code="200"} 1.0',
                 'hangwatch_webhook_requests_total{code="400"} 1.0',
                 'hangwatch_webhook_requests_total{code="401"} 1.0',
                 'hangwatch_webhook_decisions_total{action="restart",reason="hung"} 1.0',
                 'hangwatch_webhook_restarts_total{result="ok",target="vllm-a"} 1.0',
                 "hangwatch_webhook_jobs_in_progress 0.0"):
        assert line in text


def test_label_values_cannot_inject_log_lines(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    h = harness()
    h.post(payload(h.alert(target="x\nalertname=Fake action=restart", container="y" * 5000)))
    h.settle()
    line = next(r.getMessage() for r in caplog.records if "action=" in r.getMessage())
    assert "\n" not in line and len(line) < 600 and "reason=unknown_target" in line


def test_an_alert_that_starts_in_the_future_restarts_nothing(harness):
    """Before: startsAt an hour ahead skipped "already restarted since the alert began" (the
    container had restarted 10 minutes ago) and the container was restarted again."""
    h = harness()
    h.restarter.by_name["vllm-a"].state["StartedAt"] = iso(h.clock() - 600)
    assert h.post(payload(h.alert(starts_at=iso(h.clock() + 3600)))).status_code == 200
    h.settle()
    assert h.restarter.restarts == [] and h.rechecker.calls == [] and h.restarter.gets == []
    assert reasons(h) == [("skip", "starts_in_future")]
    assert "3600s ahead of this host's clock" in h.decisions()[0]["detail"]


def test_a_start_a_few_seconds_ahead_is_clock_skew_and_still_acted_on(harness):
    h = harness()
    h.post(payload(h.alert(starts_at=iso(h.clock() + 20))))
    h.settle()
    assert reasons(h) == [("restart", "hung")] and len(h.restarter.restarts) == 1


def test_incident_records_hold_container_logs_and_are_private(harness):
    h = harness()
    h.post(payload(h.alert()))
    h.settle()
    (incident,) = (h.state_dir / "incidents").glob("*.json")
    assert incident.stat().st_mode & 0o777 == 0o600
    assert (h.state_dir / "ledger.jsonl").stat().st_mode & 0o777 == 0o600
    for directory in (h.state_dir, h.state_dir / "incidents", h.state_dir / "locks"):
        assert directory.stat().st_mode & 0o777 == 0o700, directory
    assert not [p for p in (h.state_dir / "incidents").iterdir() if p.name.startswith(".")], "a temporary file left"
