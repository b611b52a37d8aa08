"""``/probe``: one target read within its scrape budget and answered as text, on the loop or a worker.

A busy backend's probe needs no thread: its /metrics is read on the server's loop
(``loopfetch``), parsed and rendered there. What would block — the idle probe, an engine
version not known yet, a host name, TLS, another module — goes to a worker, which goes on
through ``observe_backend`` from the reading already taken. A probe that cannot start within
half its budget is a 503, not ``hangwatch_up 0``: the backend was never asked, and the rules
must see a gap, not a verdict.
"""
from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.modules import MODULES
from hangwatch.observe import metrics_observation, observe_backend, probe_due

from . import evloop
from .collector import BackendCollector, render_series
from .config import ExporterConfig
from .fds import IDLE_CONNECTIONS, loop_pool_size
from .httpserver import Request, Response
from .loopfetch import LoopClient
from .query import Asked
from .querycache import QueryCache
from .reuse import VersionCache
from .selfmetrics import PROBE_SECONDS, probes_counter

TEXT = "text/plain; charset=utf-8"
SCRAPE_TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"

log = logging.getLogger("hangwatch.exporter")


def scrape_budget(header: str | None, config: ExporterConfig) -> float:
    """Prometheus' scrape timeout minus an offset, or the configured default."""
    try:
        budget = min(float(header) - config.timeout_offset, config.timeout)
    except (TypeError, ValueError):
        budget = config.timeout
    return max(0.2, budget if budget == budget else config.timeout)


class Prober:
    """Answers ``/probe``: the target read within the scrape budget, rendered as text."""

    def __init__(self, config: ExporterConfig):
        self.config = config
        self.client = Client(max_idle=IDLE_CONNECTIONS)
        self.loop_client: LoopClient | None = None  # made on the server's loop, on its first probe
        self.versions = VersionCache()
        self.queries = QueryCache(config)

    def asked(self, query: str) -> Asked | tuple[int, str, bytes]:
        """What a /probe query asks (target, module, options), or the 400/403 answer."""
        read = self.queries.asked(query)
        return read if isinstance(read, Asked) else (read.code, TEXT, f"{read.why}\n".encode())

    def collector(self, asked: Asked, timeout_header: str | None, waited: float) -> BackendCollector:
        # The budget counts from the request's arrival: time spent waiting for a worker is spent.
        budget = max(0.1, scrape_budget(timeout_header, self.config) - waited)
        return BackendCollector(asked.target, asked.module, budget, asked.options, self.client,
                                versions=self.versions)

    def answer(self, query: str, timeout_header: str | None, waited: float = 0.0) -> tuple[int, str, bytes]:
        asked = self.asked(query)
        if not isinstance(asked, Asked):
            return asked
        target, module = asked.target, asked.module
        collector = self.collector(asked, timeout_header, waited)
        started = time.monotonic()
        deadline = Deadline.after(collector.budget)
        # TEMPORARY (branch core): on a worker thread until the server is on asyncio.
        observation = asyncio.run(MODULES[module].observe(self.client, target, deadline, collector.options))
        body = render_series(collector.series(observation, started, deadline))
        _log_probe(target, module, collector.last_observation, time.monotonic() - started)
        return 200, CONTENT_TYPE_LATEST, body

    def route(self, request: Request) -> Response:
        waited = time.monotonic() - request.received
        code, content_type, body = self.answer(request.query, request.headers.get(SCRAPE_TIMEOUT_HEADER), waited)
        asked = self.asked(request.query)  # (kept: no second reading of the query)
        module = asked.module if isinstance(asked, Asked) else module_label(request.query)
        return self._counted(request, module, code, content_type, body)

    def _counted(self, request: Request, module: str, code: int, content_type: str, body: bytes) -> Response:
        probes_counter(module, code).inc()
        PROBE_SECONDS.observe(time.monotonic() - request.received)
        return Response(code, content_type, body)

    def on_loop(self, request: Request, reply) -> None:
        """A busy backend's probe without a thread; anything that would block is handed to a
        worker, which does what ``route`` does from where this stopped."""
        asked = self.asked(request.query)
        if not isinstance(asked, Asked):
            reply(self._counted(request, module_label(request.query), *asked))
            return
        target, module = asked.target, asked.module
        url = target.rstrip("/") + "/metrics"
        if module != "backend" or not LoopClient.can_get(url):  # (can_get's answer is kept per URL)
            reply(lambda: self.route(request))
            return
        loop = evloop.running()
        if self.loop_client is None or self.loop_client.loop is not loop:
            self.loop_client = LoopClient(loop, max_idle=loop_pool_size(self.config))
        collector = self.collector(asked, request.headers.get(SCRAPE_TIMEOUT_HEADER),
                                   time.monotonic() - request.received)
        started = taken_at = time.monotonic()
        deadline = Deadline.after(collector.budget)

        def read(fetched) -> None:
            try:
                observation = metrics_observation(taken_at, fetched, collector.options)
                version = collector.known_version(observation)
                if probe_due(observation, collector.options) or collector.version_asks(observation, deadline,
                                                                                       version):
                    reply(lambda: self._finish(request, collector, observation, started, deadline))
                else:  # nothing more to ask: the series as they are (what _finish would give)
                    reply(self._rendered(request, collector, observation, started, deadline, version))
            except Exception:  # as BoundedHTTPServer.call: a bug is a logged 500, never an unanswered scrape
                log.exception("/probe of %s failed", target)
                reply(Response(500, TEXT, b"internal error (logged)\n"))
        self.loop_client.get(url, deadline, read, headers=collector.options.auth_headers())

    def _finish(self, request: Request, collector: BackendCollector, observation, started: float,
                deadline: Deadline) -> Response:
        """``observe_backend`` from the /metrics reading the loop took, then the series."""
        observation = asyncio.run(observe_backend(self.client, collector.target, deadline, collector.options,
                                                  first=observation))  # TEMPORARY (branch core)
        return self._rendered(request, collector, observation, started, deadline)

    def _rendered(self, request: Request, collector: BackendCollector, observation, started: float,
                  deadline: Deadline, version: str | None = None) -> Response:
        body = render_series(collector.series(observation, started, deadline, version))
        _log_probe(collector.target, collector.module, collector.last_observation, time.monotonic() - started)
        return self._counted(request, collector.module, 200, CONTENT_TYPE_LATEST, body)

    def start_within(self, request: Request) -> float:
        """A probe may wait for a worker up to half its budget; the rest is the reading's."""
        return scrape_budget(request.headers.get(SCRAPE_TIMEOUT_HEADER), self.config) / 2

    def overloaded(self, request: Request) -> Response:
        probes_counter(module_label(request.query), 503).inc()
        return Response(503, TEXT, b"overloaded: every probe worker is busy (max_concurrent_probes); "
                                   b"not a verdict on the target\n")


def _log_probe(target: str, module: str, observation, seconds: float) -> None:
    """One line per probe at debug level: what was read and whether the idle probe went out.
    The target is ``scheme://host[:port]``; no key or header is logged."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    reading = observation.reading if observation else None
    probe = observation.probe if observation else None
    log.debug("probe target=%s module=%s status=%s in_flight=%s idle_probe=%s seconds=%.3f%s", target, module,
              observation.status if observation else "none", "-" if reading is None else f"{reading.in_flight:g}",
              probe.outcome if probe else "not_sent", seconds,
              f" error={observation.error!r}" if observation and observation.error else "")


def module_label(query: str) -> str:
    module = (parse_qs(query).get("module") or ["backend"])[0] or "backend"
    return module if module in MODULES else "invalid"
