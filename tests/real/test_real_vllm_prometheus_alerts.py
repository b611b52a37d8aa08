"""The example Prometheus and Alertmanager configs, pointed at a real vLLM through the exporter.

Real Prometheus (the rules `hangwatch rules` renders for a 3 s scrape) scrapes the
real `hangwatch exporter`, which reads the package's real vLLM; real Alertmanager routes the
restart alert to a recording receiver. Busy: no alert, no probe (vLLM's own counters).
EngineCore stopped with work in flight: exactly one HangwatchBackendHung notification, and
the state stays hung for as long as the engine stays stopped (a state that left hung and came
back would be a second notification: Alertmanager re-notifies an alert that resolved).
"""
import time

import pytest

from hangwatch.demo.chain import HUNG
from hangwatch.demo.wait import wait_for_seconds, wait_until
from harness.stack import Stack
from tests.real.test_real_vllm_verdicts import inference_requests
from tests.support.require import require_binary

pytestmark = pytest.mark.real

RUNNING = "vllm:num_requests_running"
SCRAPE, SCRAPE_TIMEOUT = 3.0, 2.0


@pytest.fixture
def stack(vllm, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    stack = Stack(tmp_path, scrape_interval=SCRAPE, scrape_timeout=SCRAPE_TIMEOUT, simulator=vllm)
    stack.start()
    try:
        yield stack
    finally:
        stack.close()


def evidence(stack: Stack, seconds: float) -> str:
    """What Prometheus recorded: the state at every half scrape, and every scrape's outcome."""
    now = time.time()

    def raw(selector):
        return [(round(float(t) - now, 1), float(v)) for s in stack.query(f"{selector}[{round(seconds)}s]")
                for t, v in s["values"]]
    up, durations = raw('up{job="hangwatch"}'), raw('scrape_duration_seconds{job="hangwatch"}')
    return (f"states (seconds ago, state): {stack.state_history(seconds)}\n"
            f"scrapes (time, up): {up}\nscrape durations: {durations}\n{stack.logs(15)}")


def test_busy_real_vllm_never_alerts_and_a_frozen_one_alerts_once(vllm, stack):
    stack.wait_state("idle", timeout=60)
    with vllm.generations(4, max_tokens=20000, deadline_s=180) as load:
        vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        stack.wait_state("busy", timeout=30)
        before = inference_requests(vllm.metrics())
        busy_from = time.monotonic()
        wait_for_seconds(5 * SCRAPE, "five scrapes of a busy server", check=stack.check_alive)
        # What the rules said of those scrapes, once they said it of the last one too.
        stack.wait_judged(time.time())
        busy_seconds = time.monotonic() - busy_from
        # Every rule evaluation over those five scrapes: busy, never anything else. (None is
        # a scrape gap, no reading at all: no verdict, but it must stay rare.)
        states = [state for _, state in stack.state_history(busy_seconds)]
        assert set(states) <= {"busy", None} and states.count("busy") > 0.8 * len(states), \
            evidence(stack, busy_seconds + 10)
        assert inference_requests(vllm.metrics()) == before, "hangwatch sent an inference request while busy"
        assert not stack.receiver.alerts("/alerts") and not stack.ever("hung", 30)
        try:
            vllm.freeze()
            frozen_at = time.monotonic()
            vllm.wait_frozen(running=4)
            wait_until(lambda: stack.receiver.alerts("/alerts", HUNG), 45, "the hang notification")
            latency = time.monotonic() - frozen_at
            hung_at = time.monotonic()
            wait_for_seconds(3 * SCRAPE, "three more scrapes of the frozen engine", check=stack.check_alive)
            still_hung = [state for _, state in stack.state_history(time.monotonic() - hung_at)]
        finally:
            vllm.thaw()
        assert not load.errors(), load.errors()
    notifications = stack.receiver.alerts("/alerts", HUNG)
    # One hang, told once: a single firing episode (one alert, one startsAt; an alert that
    # resolved and fired again would carry a new startsAt) while the state stayed hung.
    # Alertmanager delivers it again when the receiver's 200 comes after its flush deadline
    # (the stack's 1 s group_interval; seen in CI with this test process busy: the same
    # alert, the same startsAt, twice); receivers must tolerate that (the webhook's ledger
    # does), so a redelivery of the same episode is not a second notification.
    episodes = {(alert["labels"]["target"], alert["startsAt"]) for _, alert in notifications}
    assert len(episodes) == 1 and set(still_hung) == {"hung"}, (
        f"{len(notifications)} notifications of {len(episodes)} episodes {sorted(episodes)}\n"
        f"{evidence(stack, time.monotonic() - frozen_at + 5)}")
    labels = notifications[0][1]["labels"]
    assert (labels["target"], labels["container"], labels["action"]) == ("vllm-a", "vllm-a", "restart")
    print(f"real vLLM frozen -> hang notification in {latency:.1f} s ({SCRAPE:g} s scrape)")
