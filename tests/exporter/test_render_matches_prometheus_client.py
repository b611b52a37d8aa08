"""The exporter renders /probe answers itself, byte for byte what prometheus_client writes.

``collector.render_series`` replaces a fresh CollectorRegistry + generate_latest per probe;
Prometheus must see exactly the same text.
"""
from __future__ import annotations

import pytest

from hangwatch.exporter.collector import render_series, series_for
from hangwatch.observation import TIMEOUT
from hangwatch.observe import BLIND, OK, Observation
from hangwatch.probe import ProbeResult
from hangwatch.reading import Reading, parse
from tests.support.exposition import reference_text
from tests.test_reading import VLLM_TWO_ENGINES

BUSY = parse(VLLM_TWO_ENGINES)
OBSERVATIONS = {
    "busy": (Observation(0.0, OK, reading=BUSY), "backend"),
    "idle probed": (Observation(0.0, OK, reading=Reading("vllm", 0.0, 0.0, steps=1e21, kv_cache_usage=1e-7,
                                                                   process_start=1.7644e9, models=("a", "b"),
                                                                   version="0.32.0"),
                                probe=ProbeResult(True, 0.0123, "ok")), "backend"),
    "failed probe": (Observation(0.0, OK, reading=Reading("llamacpp", 0, 0),
                                 probe=ProbeResult(False, 2.5, "no")), "backend"),
    "stalled": (Observation(0.0, TIMEOUT, error="x"), "backend"),
    "blind": (Observation(0.0, BLIND, error="x"), "fastchat_worker"),
    "controller": (Observation(0.0, OK, listed_models=("m\"1", "m\\2", "m\n3", "ünï")), "fastchat_controller"),
    "odd labels": (Observation(0.0, OK, reading=Reading("vllm", 1, 2, models=('q"uote', "back\\slash", "new\nline"),
                                                                 version='v"1\\')), "backend"),
}


@pytest.mark.parametrize("name", OBSERVATIONS)
def test_series_render_byte_for_byte_as_generate_latest(name):
    observation, module = OBSERVATIONS[name]
    series = list(series_for(observation, module, 0.004567))
    ours = render_series(series)
    assert ours == reference_text(series)
    assert ours.endswith(b"\n") and b"hangwatch_up" in ours
    assert render_series(series) == ours  # the kept HELP/TYPE lines change nothing


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 4, 0.031, 1e-7, 1e21, 1.7644e9, 123456.0, 1234567.0, 12345678.5,
                                   -1234567.0, float("inf"), float("-inf"), float("nan"), 5123.0, 2 ** 53 + 1.0])
def test_numbers_are_written_as_prometheus_client_writes_them(value):
    from prometheus_client.utils import floatToGoString

    from hangwatch.exporter.collector import Series, _go_float
    assert _go_float(value) == floatToGoString(value)
    # render_series inlines the same: a sample's text is the same
    assert render_series([Series("n", "d", "gauge", (), (((), value),))]).endswith(
        f" {floatToGoString(value)}\n".encode())
