"""The example Prometheus and Alertmanager configs, pointed at a real vLLM through the exporter.

Real Prometheus (the rules `hangwatch rules` renders for a 3 s scrape) scrapes the
real `hangwatch exporter`, which reads the session's real vLLM; real Alertmanager routes the
restart alert to a recording receiver. Busy: no alert, no probe (vLLM's own counters).
EngineCore stopped with work in flight: exactly one HangwatchBackendHung notification.

The file name sorts it last in tests/real: after this freeze the CPU vLLM answered slowly for
a while in one CI run, which the timing-sensitive fact tests must not see.
"""
import time

import pytest

from tests.e2e.stack import Stack, wait_until
from tests.real.test_real_vllm_verdicts import inference_requests
from tests.support.require import require_binary

pytestmark = pytest.mark.real

HUNG = "HangwatchBackendHung"
RUNNING = "vllm:num_requests_running"


@pytest.fixture
def stack(vllm, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    stack = Stack(tmp_path, scrape_interval=3.0, scrape_timeout=2.0, simulator=vllm)
    stack.start()
    try:
        yield stack
    finally:
        stack.close()


def test_busy_real_vllm_never_alerts_and_a_frozen_one_alerts_once(vllm, stack):
    stack.wait_state("idle", timeout=60)
    with vllm.generations(4, max_tokens=20000, deadline_s=180) as load:
        vllm.wait_until(lambda p: p.value(RUNNING) == 4, 60, what="4 running")
        stack.wait_state("busy", timeout=30)
        before = inference_requests(vllm.metrics())
        busy_until, states = time.monotonic() + 15, []  # five scrapes of a busy server
        while time.monotonic() < busy_until:
            states.append(stack.state())
            time.sleep(0.5)
        # None is a scrape gap (a slow /metrics of a loaded CPU vLLM may miss the scrape
        # timeout): no reading, no verdict. Anything else than busy would be wrong.
        assert set(states) <= {"busy", None} and states.count("busy") > len(states) // 2, states
        assert inference_requests(vllm.metrics()) == before, "hangwatch sent an inference request while busy"
        assert not stack.receiver.alerts("/alerts") and not stack.ever("hung", 30)
        try:
            vllm.freeze()
            frozen_at = time.monotonic()
            wait_until(lambda: stack.receiver.alerts("/alerts", HUNG), 45, "the hang notification")
            latency = time.monotonic() - frozen_at
            settle = time.monotonic() + 9
            wait_until(lambda: time.monotonic() > settle, 10, "three more scrapes")
        finally:
            vllm.thaw()
        assert not load.errors(), load.errors()
    notifications = stack.receiver.alerts("/alerts", HUNG)
    assert len(notifications) == 1, notifications
    labels = notifications[0][1]["labels"]
    assert (labels["target"], labels["container"], labels["action"]) == ("vllm-a", "vllm-a", "restart")
    print(f"real vLLM frozen -> hang notification in {latency:.1f} s (3 s scrape)")
