"""The idle probe goes out only when two readings a moment apart show an idle engine.

An engine's gauges count only what reached its scheduler: a request the API server is still
receiving or tokenizing, or a client's next request after one finished, is not in them yet. The
short soak measured it on a real vLLM under a saturating load: a reading with nothing in flight,
and 15 ms later the probe met a request in the engine while the load had eight open. So the
load is read again ``IDLE_CONFIRM_S`` later (``hangwatch.observe.observe_load``), and the probe
goes out only if that reading also shows nothing in flight and no engine work between the two.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hangwatch.check import check
from hangwatch.observe import IDLE_CONFIRM_S
from tests.support.pages import Page, PageServer
from tests.test_hostile_backends import idle_vllm

DATA = Path(__file__).parent / "data" / "vllm-0.32"
IDLE_PAGE = (DATA / "idle.prom").read_bytes()


def with_line(page: bytes, family: str, value: float) -> bytes:
    """``page`` with ``family``'s (unlabelled-by-reason) sample set to ``value``."""
    changed, count = re.subn(rb"^(" + re.escape(family.encode()) + rb"\{[^}]*\}) \S+$",
                             lambda m: m.group(1) + b" " + repr(value).encode(), page, flags=re.M)
    assert count >= 1, family
    return changed


@pytest.fixture
def backend():
    server = PageServer()
    try:
        yield server
    finally:
        server.stop()


def probe_requests(server: PageServer) -> list[str]:
    return [path for _, path, _, _ in server.sent if path != "/metrics"]


def test_a_request_reaching_the_engine_between_the_two_readings_gets_no_probe(backend):
    idle_vllm(backend)
    busy = with_line(IDLE_PAGE, "vllm:num_requests_running", 1.0)
    backend.pages["/metrics"] = Page(IDLE_PAGE, next=Page(busy))
    result = check(backend.url, interval=0.01, timeout=2)
    # The first observation is the second reading: one running (its frozen counters then read
    # hung over the next readings, as they should; what matters here is that nothing was sent).
    first = result.observations[0]
    assert first.reading.in_flight == 1 and first.probe is None
    assert probe_requests(backend) == []
    assert not result.probe_sent


def test_engine_work_between_the_two_readings_is_idle_and_gets_no_probe(backend):
    """Nothing in flight either time, but a request finished in between: the engine just worked."""
    idle_vllm(backend)
    worked = with_line(with_line(IDLE_PAGE, "vllm:generation_tokens_total", 7.0), "vllm:prompt_tokens_total", 5.0)
    backend.pages["/metrics"] = Page(IDLE_PAGE, next=Page(worked))
    result = check(backend.url, interval=0.01, timeout=2)
    assert result.verdict.state == "idle"
    assert probe_requests(backend) == []
    assert not result.probe_sent


def test_an_engine_idle_in_both_readings_gets_one_probe_after_the_second(backend):
    idle_vllm(backend)
    result = check(backend.url, interval=0.01, timeout=2)
    assert result.verdict.state == "idle" and result.probe_sent
    paths = [path for _, path, _, _ in backend.sent]
    assert paths[:2] == ["/metrics", "/metrics"] and "/v1/completions" in paths
    assert paths.index("/v1/completions") > 1


def test_the_second_reading_waits_the_confirmation_interval_within_the_deadline(backend):
    import time
    idle_vllm(backend)
    started = time.monotonic()
    check(backend.url, interval=0.01, timeout=2)
    assert time.monotonic() - started >= IDLE_CONFIRM_S
    started = time.monotonic()
    short = check(backend.url, interval=0.01, timeout=0.2)  # a short budget: a quarter of what is left, at most
    # one idle reading ends within its 0.2 s deadline (a generous multiple of it, for a loaded
    # machine), and the wait left the probe time to go out
    assert time.monotonic() - started < 0.2 * 5
    assert short.probe_sent


@pytest.mark.parametrize("slot_back", [True, False])
def test_the_wait_between_the_readings_is_the_callers_pause_and_no_slot_back_means_no_probe(backend, slot_back):
    """The exporter lends its probe slot out while the confirmation waits (``observe.Pause``); when
    none comes back in time, nothing more is sent: the first reading stands, idle and unprobed."""
    import asyncio

    from hangwatch.client import Client
    from hangwatch.deadline import Deadline
    from hangwatch.observe import observe_backend
    idle_vllm(backend)
    asked = []

    async def pause(seconds: float, within: float) -> bool:
        asked.append((seconds, within))
        await asyncio.sleep(seconds)
        return slot_back

    async def observe():
        return await observe_backend(Client(), backend.url, Deadline.after(4.0), pause=pause)
    observation = asyncio.run(observe())
    [(seconds, within)] = asked
    assert seconds == IDLE_CONFIRM_S and 0 < within < 4.0 - seconds
    paths = [path for _, path, _, _ in backend.sent]
    if slot_back:
        assert observation.probe is not None and observation.probe.outcome == "answered", observation
        assert paths.count("/metrics") == 2 and "/v1/completions" in paths
    else:
        assert observation.probe is None and observation.reading.in_flight == 0
        assert "not probed" in observation.detail
        assert paths == ["/metrics"], paths
