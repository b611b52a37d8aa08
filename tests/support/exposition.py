"""What the exporter's /probe would answer, through the exporter's own code, for tests.

``probe_text`` writes an observation's series the way the prober does (``series_for`` and
``render_series``); ``scrape`` reads a live target through ``Prober.answer`` itself; ``samples``
parses either with prometheus_client's own parser. ``reference_text`` is the independent
reference the exporter's hand-written exposition is compared with: prometheus_client's
families and ``generate_latest`` for the same series.
"""
from __future__ import annotations

import asyncio
from urllib.parse import urlencode

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.exporter.collector import render_series, series_for
from hangwatch.exporter.config import ExporterConfig
from hangwatch.exporter.prober import Prober
from hangwatch.observation import Observation


def probe_text(observation: Observation, module: str, duration: float = 0.01, version: str | None = None,
               stall_window: float | None = None) -> bytes:
    return render_series(series_for(observation, module, duration, version, stall_window))


def scrape(url: str, module: str = "backend", budget: float = 10.0, config: ExporterConfig | None = None) -> bytes:
    """One /probe answer's body for ``url``, from a fresh ``Prober`` (nothing reused)."""
    config = config or ExporterConfig(timeout=budget)
    code, _, body = asyncio.run(Prober(config).answer(urlencode({"target": url, "module": module}), None))
    assert code == 200, (code, body)
    return body


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


class _Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def as_families(all_series):
    """The same series as prometheus_client families."""
    for series in all_series:
        kind = GaugeMetricFamily if series.kind == "gauge" else CounterMetricFamily
        if not series.labels:
            yield kind(series.name, series.doc, value=series.samples[0][1])
            continue
        family = kind(series.name, series.doc, labels=list(series.labels))
        for values, value in series.samples:
            family.add_metric(list(values), value)
        yield family


def reference_text(all_series) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(as_families(all_series))))
    return generate_latest(registry)
