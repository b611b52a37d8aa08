"""Restart on `stalled` only where a target opts in (``restart_on: [hung, stalled]``), after the
webhook's own re-check saw no output across its readings from the process the alert saw; a
restart for a stall that does not heal it opens the circuit (people are told)."""
from __future__ import annotations

import pytest

from hangwatch.webhook.config import ConfigError, parse_config

from .fakes import FakeRechecker, iso, payload

STALLED = "HangwatchBackendStalled"
TARGETS = [
    {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000"},
    {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001", "restart_on": ["hung", "stalled"]},
]


def reasons(h):
    return [(d["action"], d["reason"]) for d in h.decisions()]


def stall_alert(h, target="vllm-b", **kwargs):
    """HangwatchBackendStalled as the rules send it: warning, no action label."""
    alert = h.alert(alertname=STALLED, target=target, container=target, severity="warning", **kwargs)
    del alert["labels"]["action"]
    return alert


def test_a_stall_alert_never_restarts_a_target_that_did_not_opt_in(harness):
    h = harness(rechecker=FakeRechecker("stalled"), targets=TARGETS)
    h.post(payload(stall_alert(h, target="vllm-a")))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", "not_opted_in")]
    assert h.rechecker.calls == []


def test_an_opted_in_target_is_restarted_after_its_own_recheck_sees_no_output(harness):
    h = harness(rechecker=FakeRechecker("stalled"), targets=TARGETS)
    h.post(payload(stall_alert(h)))
    h.settle()
    assert [name for name, _ in h.restarter.restarts] == ["vllm-b"]
    assert reasons(h) == [("restart", "stalled")]
    call = h.rechecker.calls[0]
    assert call["stall_window"] == 2 * call["interval"]  # no output across its own three readings


@pytest.mark.parametrize("state", ["busy", "idle", "down"])
def test_a_stall_alert_whose_recheck_sees_output_is_not_restarted(harness, tmp_path, state):
    h = harness(rechecker=FakeRechecker(state), targets=TARGETS, state_dir=tmp_path / state)
    h.post(payload(stall_alert(h)))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", f"recheck_{state}")]


def test_a_default_target_recheck_that_says_stalled_is_not_restarted(harness):
    h = harness(rechecker=FakeRechecker("stalled"), targets=TARGETS)
    h.post(payload(h.alert()))  # HangwatchBackendHung for vllm-a (restart_on: [hung])
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", "recheck_stalled")]


def test_readings_from_a_process_newer_than_the_alert_are_not_the_stall_it_saw(harness):
    h = harness(rechecker=FakeRechecker("stalled"), targets=TARGETS)
    h.rechecker.process_start = h.clock() - 10  # the alert began 60 s ago
    h.post(payload(stall_alert(h)))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", "already_restarted")]


def test_a_restart_that_did_not_heal_a_stall_opens_the_circuit(harness):
    h = harness(rechecker=FakeRechecker("stalled"), targets=TARGETS)
    h.post(payload(stall_alert(h)))
    h.settle()
    assert len(h.restarter.restarts) == 1
    assert not h.state.policy.circuit_open()["vllm-b"]
    h.clock.advance(120)  # within the 15 min cooldown, stalled again (an alert begun after the restart)
    h.post(payload(stall_alert(h, starts_at=iso(h.clock() - 30))))
    h.settle()
    assert reasons(h)[-1] == ("skip", "stall_not_healed") and len(h.restarter.restarts) == 1
    assert h.state.policy.circuit_open()["vllm-b"]
    assert 'hangwatch_webhook_circuit_open{target="vllm-b"} 1.0' in h.client.get("/metrics").get_data(as_text=True)
    h.clock.advance(1000)  # past the cooldown: the circuit stays open until reset or the budget window passes
    h.post(payload(stall_alert(h, starts_at=iso(h.clock() - 30))))
    h.settle()
    assert len(h.restarter.restarts) == 1


def test_a_hung_restart_coming_back_within_the_cooldown_is_just_cooldown(harness):
    h = harness(rechecker=FakeRechecker("hung"), targets=TARGETS)
    h.post(payload(h.alert(target="vllm-b", container="vllm-b")))
    h.settle()
    h.clock.advance(120)
    h.post(payload(h.alert(target="vllm-b", container="vllm-b", starts_at=iso(h.clock() - 30))))
    h.settle()
    assert reasons(h) == [("restart", "hung"), ("skip", "cooldown")]
    assert not h.state.policy.circuit_open()["vllm-b"]


def test_restart_on_names_only_known_verdicts(tmp_path):
    with pytest.raises(ConfigError, match=r"targets\[0\].restart_on: .*busy"):
        parse_config({"state_dir": str(tmp_path), "targets": [
            {"name": "a", "container": "a", "url": "http://127.0.0.1:1", "restart_on": ["hung", "busy"]}]})

