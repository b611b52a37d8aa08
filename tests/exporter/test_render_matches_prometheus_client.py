"""The exporter renders /probe answers itself, byte for byte what prometheus_client writes.

``collector.render`` replaces a fresh CollectorRegistry + generate_latest per probe (a third
of the exporter's CPU per scrape went there); Prometheus must see exactly the same text.
"""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from hangwatch.exporter.collector import families_for, render
from hangwatch.fetch import TIMEOUT
from hangwatch.observe import BLIND, OK, Observation
from hangwatch.probe import ProbeResult
from hangwatch.reading import Reading, parse
from tests.test_reading import VLLM_TWO_ENGINES


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def reference(families) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families)))
    return generate_latest(registry)


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
def test_render_is_byte_for_byte_generate_latest(name):
    observation, module = OBSERVATIONS[name]
    ours = render(families_for(observation, module, 0.004567))
    assert ours == reference(families_for(observation, module, 0.004567))
    assert ours.endswith(b"\n") and b"hangwatch_up" in ours


def test_families_the_fast_path_does_not_cover_go_through_generate_latest():
    histogram = HistogramMetricFamily("h", "a histogram", buckets=[("1.0", 2), ("+Inf", 3)], sum_value=4)
    families = [GaugeMetricFamily("g", "a gauge", value=1), histogram]
    assert render(families) == reference(families)


@pytest.mark.parametrize("name", OBSERVATIONS)
def test_series_render_straight_to_the_same_bytes(name):
    """``render_series`` (the /probe path: no prometheus_client objects) writes exactly what
    the families of the same series render to."""
    from hangwatch.exporter.collector import as_families, render_series, series_for
    observation, module = OBSERVATIONS[name]
    series = list(series_for(observation, module, 0.004567))
    assert render_series(series) == render(as_families(series)) == reference(families_for(observation, module, 0.004567))
    assert render_series(series) == render_series(series)  # the kept HELP/TYPE lines change nothing


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 4, 0.031, 1e-7, 1e21, 1.7644e9, 123456.0, 1234567.0, 12345678.5,
                                   -1234567.0, float("inf"), float("-inf"), float("nan"), 5123.0, 2 ** 53 + 1.0])
def test_numbers_are_written_as_prometheus_client_writes_them(value):
    from prometheus_client.utils import floatToGoString

    from hangwatch.exporter.collector import _go_float
    assert _go_float(value) == floatToGoString(value)
