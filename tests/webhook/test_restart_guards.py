"""Two of the webhook's safety guards, each pinned again from a second side.

- Only ``hung`` restarts: every other verdict of the re-check (down — perhaps loading
  weights —, blind, busy, idle, restarted) is a skip with its own reason. (The behaviour side:
  ``test_recheck_simulator``, the real ``check()`` against a down, busy, idle, asleep server.)
- The torn-tail repair on a ledger that already holds a restart: the repair cuts back to the
  last newline and not one byte further, so the restart stays on record — for this webhook
  and for the next one that reads the ledger (a webhook restarted, another replica). A repair
  on an empty ledger (``test_ledger``) cannot see a cut that goes one byte too far.
"""
from __future__ import annotations

import json

import pytest

from hangwatch.webhook.ledger import Ledger

from .fakes import FakeRechecker, payload

TORN = b'{"action": "skip", "at": 1799999000.5, "event": "deci'  # a crash mid-write


def reasons(h):
    return [(d["action"], d["reason"]) for d in h.decisions()]


@pytest.mark.parametrize("state", ["down", "blind", "busy", "idle", "restarted"])
def test_only_hung_restarts(harness, state):
    h = harness(rechecker=FakeRechecker(state))
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("skip", f"recheck_{state}")]


def test_hung_restarts(harness):
    h = harness(rechecker=FakeRechecker("hung"))
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == [("vllm-a", 30.0)] and reasons(h) == [("restart", "hung")]


def test_the_repair_keeps_the_restart_before_the_torn_tail(tmp_path):
    ledger = Ledger(str(tmp_path))
    restart = {"event": "restart", "at": 1_800_000_000.0, "target": "vllm-a", "container": "vllm-a"}
    ledger.append(restart)
    with open(tmp_path / "ledger.jsonl", "ab") as handle:
        handle.write(TORN)
    ledger.append({"event": "decision", "at": 1_800_000_001.0, "target": "vllm-a", "reason": "cooldown"})
    ledger.close()
    lines = (tmp_path / "ledger.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and [json.loads(line)["event"] for line in lines[:-1]] == ["restart", "decision"]
    fresh = Ledger(str(tmp_path))  # what the next webhook reads
    try:
        assert fresh.last_restart("vllm-a") == restart["at"]
    finally:
        fresh.close()


def test_a_torn_tail_after_a_restart_still_holds_the_cooldown_for_the_next_webhook(harness, tmp_path):
    """A restart, then a crash mid-write; the next decision repairs the ledger. A webhook that
    starts afterwards (a new process, another replica) still sees the restart: no second
    restart inside the cooldown."""
    first = harness(state_dir=tmp_path / "state")
    first.post(payload(first.alert()))
    first.settle()
    assert len(first.restarter.restarts) == 1
    with open(tmp_path / "state" / "ledger.jsonl", "ab") as handle:
        handle.write(TORN)
    first.clock.advance(300)
    first.post(payload(first.alert()))  # inside the 15 min cooldown: recorded, and the tail repaired
    first.settle()
    first.close()
    second = harness(state_dir=tmp_path / "state", clock=first.clock, restarter=first.restarter)
    first.clock.advance(300)
    second.post(payload(second.alert()))
    second.settle()
    assert len(second.restarter.restarts) == 1
    assert [d["reason"] for d in second.decisions()] == ["hung", "cooldown", "cooldown"]


def test_a_dry_run_restart_is_not_a_restart_in_the_ledger(tmp_path):
    ledger = Ledger(str(tmp_path))
    try:
        ledger.append({"event": "restart", "at": 1_800_000_000.0, "target": "vllm-a", "dry_run": True})
        assert ledger.last_restart("vllm-a") is None and ledger.restarts_since(0) == []
    finally:
        ledger.close()


def test_after_a_dry_run_the_real_webhook_restarts_without_a_cooldown(harness, tmp_path):
    """Trying hangwatch in dry_run first must not hold back the first real restart."""
    trial = harness(state_dir=tmp_path / "state", dry_run=True)
    trial.post(payload(trial.alert()))
    trial.settle()
    assert trial.restarter.restarts == [] and reasons(trial) == [("restart", "hung")]
    trial.close()
    real = harness(state_dir=tmp_path / "state", clock=trial.clock)
    real.clock.advance(60)
    real.post(payload(real.alert()))
    real.settle()
    assert len(real.restarter.restarts) == 1
