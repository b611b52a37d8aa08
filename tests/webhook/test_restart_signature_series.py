"""The webhook exports each target's last restart with its forensics signature
(``hangwatch_webhook_last_restart_timestamp_seconds{target, signature}``): the series the alerts'
query templates and the dashboard's restart annotation join, so the signature reaches people."""
from __future__ import annotations

import re

from .fakes import payload
from .test_forensics import CAPTURE, Capturer, built  # noqa: F401 (fixture)

NAME = "hangwatch_webhook_last_restart_timestamp_seconds"


def restart_series(h) -> dict[tuple[str, str], float]:
    text = h.client.get("/metrics").get_data(as_text=True)
    found = {}
    for match in re.finditer(rf'^{NAME}{{signature="([^"]*)",target="([^"]*)"}} (\S+)$', text, re.M):
        found[(match.group(2), match.group(1))] = float(match.group(3))
    return found


def test_no_series_before_any_restart(built):  # noqa: F811
    h = built(Capturer())
    assert restart_series(h) == {}


def test_the_last_restart_carries_its_signature_one_series_per_target(built):  # noqa: F811
    capturer = Capturer()
    h = built(capturer, cooldown="60s")
    h.post(payload(h.alert()))
    h.settle()
    first = h.clock()
    assert restart_series(h) == {("vllm-a", "engine_step_stuck"): first}
    capturer.answer = {**CAPTURE, "signature": "process_stopped"}
    h.clock.advance(600)
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 2
    # The previous signature's series is gone: a join on target meets one series.
    assert restart_series(h) == {("vllm-a", "process_stopped"): h.clock()}


def test_a_restart_without_a_capture_says_none(built):  # noqa: F811
    h = built(Capturer())
    h.post(payload(h.alert(target="vllm-b", container="vllm-b")))
    h.settle()
    assert restart_series(h) == {("vllm-b", "none"): h.clock()}


def test_a_skipped_alert_exports_nothing(built):  # noqa: F811
    from .fakes import FakeRechecker
    h = built(Capturer(), rechecker=FakeRechecker("busy"))
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == [] and restart_series(h) == {}
