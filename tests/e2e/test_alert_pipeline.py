"""End to end on real parts: simulator → hangwatch exporter → Prometheus (the shipped rules,
retimed to a 1 s scrape) → Alertmanager (the example routes) → a recording receiver.

Prometheus and Alertmanager are real parts (missing in CI is a failure). Every wait is on
a condition with a deadline; the "nothing happened" checks ask Prometheus itself whether
the hung state was ever 1 over the whole run.
"""
from __future__ import annotations

import time

import pytest

from hangwatch.demo.chain import HUNG
from hangwatch.demo.wait import wait_for_seconds, wait_until
from harness.stack import Stack, window
from tests.support.require import require_binary

pytestmark = pytest.mark.real


@pytest.fixture
def stack(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    stack = Stack(tmp_path, scrape_interval=1.0)
    stack.start()
    try:
        yield stack
    finally:
        stack.close()


def _hang_notifications(stack: Stack):
    return stack.receiver.alerts("/alerts", HUNG)


def test_freeze_sends_exactly_one_hang_notification(stack):
    stack.sim.set_state("busy", n=3)
    stack.wait_state("busy")
    assert not _hang_notifications(stack) and not stack.ever("hung", 60), "hung before the freeze"
    frozen_at = time.time()
    stack.sim.set_state("frozen")
    wait_until(lambda: _hang_notifications(stack), 30, "the hang notification at the webhook receiver")
    delivered_at, alert = _hang_notifications(stack)[0]
    assert alert["labels"]["target"] == "vllm-a" and alert["labels"]["container"] == "vllm-a"
    assert alert["labels"]["action"] == "restart" and alert["labels"]["severity"] == "critical"
    assert delivered_at - frozen_at < 15, "three readings + for: at a 1 s scrape take ~4 s"
    # Still hung, still firing: Alertmanager must not send it again (group_interval is 1 s).
    wait_for_seconds(5, "five more seconds of the freeze", check=stack.check_alive)
    assert stack.state() == "hung", stack.state_history(15)
    assert len(_hang_notifications(stack)) == 1, stack.state_history(30)
    # ... and to people as well: a person always hears that a server hung.
    wait_until(lambda: stack.receiver.alerts("/people", HUNG), 10, "the hang notification at the people receiver")
    assert len(stack.receiver.alerts("/people", HUNG)) == 1, stack.receiver.alerts("/people", HUNG)


def test_saturation_and_long_prefill_never_alert(stack):
    started = time.monotonic()
    stack.sim.set_state("saturated", waiting=6)
    stack.wait_state("busy")
    wait_until(lambda: stack.value('hangwatch_requests_waiting{target="vllm-a"}') or 0, 10,
               "a waiting queue in Prometheus")
    wait_for_seconds(4, "four seconds of saturation", check=stack.check_alive)
    # One 60k-token prompt in a chunked prefill: ~10 s in which only KV usage moves.
    stack.sim.set_state("long_prefill", prompt_tokens=60000)
    wait_until(lambda: stack.sim.running == 1 and stack.sim.waiting == 0, 10, "the prefill to start")
    wait_until(lambda: stack.sim.running == 0, 40, "the long prefill to finish")
    stack.wait_state("idle")
    seconds = time.monotonic() - started + 2
    assert not stack.ever("hung", seconds), "a busy engine was judged hung"
    assert stack.ever("busy", seconds)
    assert not stack.query(f'count_over_time(ALERTS{{alertname="{HUNG}"}}[{window(seconds)}])')
    assert not _hang_notifications(stack)


def test_restart_mid_window_is_restarted_not_hung(stack):
    started = time.monotonic()
    stack.sim.set_state("busy", n=3)
    stack.wait_state("busy")
    # Freeze, and restart the process once Prometheus holds one frozen reading: less than
    # the two intervals a hang needs.
    stack.sim.set_state("frozen")
    frozen_at = time.time()
    wait_until(lambda: stack.latest_sample_time("hangwatch_engine_steps_total") > frozen_at + 0.05, 10,
               "one reading of the frozen engine in Prometheus")
    restarted_at = time.monotonic()  # "restarted" from here on is this restart's, nothing earlier
    stack.sim.restart()
    stack.sim.set_state("busy", n=2)
    wait_until(lambda: stack.ever("restarted", time.monotonic() - restarted_at), 15, "the restarted state")
    stack.wait_state("busy")
    # The info alert reaches people (its for: 1m and 10m window are retimed to 4 s and 40 s).
    wait_until(lambda: stack.receiver.alerts("/people", "HangwatchBackendRestarted"), 30,
               "HangwatchBackendRestarted at the people receiver")
    seconds = time.monotonic() - started + 2
    assert not stack.ever("hung", seconds)
    assert not _hang_notifications(stack)
