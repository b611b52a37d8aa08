"""The exporter's own health on ``/metrics``: probes answered, the server's connections and workers.

Kept apart from the per-target series: these describe the exporter, live in the default
registry and outlast every scrape (node_exporter's ``_build_info`` and per-handler counters).
"""
from __future__ import annotations

import functools
import platform

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hangwatch import __version__

from .httpserver import BoundedHTTPServer, Request, Response

PROBES = Counter("hangwatch_exporter_probes", "Probe requests answered, by module and HTTP code.",
                 ["module", "code"])
PROBE_SECONDS = Histogram("hangwatch_exporter_probe_duration_seconds", "Time to answer /probe.")
Info("hangwatch_build", "The hangwatch version and the Python it runs on.").info(
    {"version": __version__, "python_version": platform.python_version()})


@functools.lru_cache(maxsize=64)
def probes_counter(module: str, code: int):
    """``PROBES``' child for a module and code, looked up once (the modules plus "invalid",
    times the codes the exporter answers: a handful)."""
    return PROBES.labels(module, str(code))


def own_metrics(request: Request) -> Response:
    return Response(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))


class _ServerCollector:
    """The servers' own counters as series (the server module imports no metrics library)."""

    def __init__(self):
        self.servers: list[BoundedHTTPServer] = []

    def collect(self):
        stats = [s.stats for s in self.servers]
        yield GaugeMetricFamily("hangwatch_exporter_connections_open", "Client connections open now.",
                                value=sum(s.connections_open for s in stats))
        yield GaugeMetricFamily("hangwatch_exporter_probes_running", "Probes being answered now.",
                                value=sum(s.work_running for s in stats))
        yield GaugeMetricFamily("hangwatch_exporter_probes_waiting", "Probes waiting for a free slot.",
                                value=sum(s.work_waiting for s in stats))
        dropped = CounterMetricFamily(
            "hangwatch_exporter_connections_dropped",
            "Client connections closed by the exporter: read_timeout (no complete request in time), "
            "evicted (room made for a new one), refused (at max_connections), bad_request.", labels=["reason"])
        for reason in ("read_timeout", "evicted", "refused", "bad_request"):
            dropped.add_metric([reason], float(sum(s.dropped[reason] for s in stats)))
        yield dropped


SERVERS = _ServerCollector()
REGISTRY.register(SERVERS)


def watch(server: BoundedHTTPServer) -> None:
    """Count ``server`` in the self-metrics (in place of any that was closed)."""
    SERVERS.servers = [s for s in SERVERS.servers if s.socket.fileno() != -1] + [server]
