"""``/probe``: one target read within its scrape budget and answered as text, awaited on the loop.

Validate the query, then one awaited ``MODULES[module].observe`` (the core decides every
request: the /metrics reading, the idle confirmation, the idle probe), then the engine's
version when ``reuse.VersionCache`` does not know it (``BackendCollector.series``), then the
text. No thread waits on a backend. A probe that cannot get a slot within half its budget is a
503, not ``hangwatch_up 0``: the backend was never asked, and the rules must see a gap, not a verdict.
"""
from __future__ import annotations

import logging
import time
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.models_memo import ModelMemo
from hangwatch.modules import MODULES
from hangwatch.observe import Pause, sleep

from .collector import BackendCollector, render_series
from .config import ExporterConfig
from .fds import pool_size
from .httpwire import Request, Response
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
        self.client = Client(max_idle=pool_size(config))  # its connections are the exporter loop's (pooled per loop)
        self.versions = VersionCache()
        self.models = ModelMemo()  # the idle probe's model per target and process start
        self.queries = QueryCache(config)

    def asked(self, query: str) -> Asked | tuple[int, str, bytes]:
        """What a /probe query asks (target, module, options), or the 400/403 answer."""
        read = self.queries.asked(query)
        return read if isinstance(read, Asked) else (read.code, TEXT, f"{read.why}\n".encode())

    def collector(self, asked: Asked, timeout_header: str | None, waited: float) -> BackendCollector:
        # The budget counts from the request's arrival: time spent waiting for a slot is spent.
        budget = max(0.1, scrape_budget(timeout_header, self.config) - waited)
        return BackendCollector(asked.target, asked.module, budget, asked.options, self.client,
                                versions=self.versions)

    async def answer(self, query: str, timeout_header: str | None, waited: float = 0.0,
                     pause: Pause = sleep) -> tuple[int, str, bytes]:
        """(HTTP code, content type, body) for a /probe query; ``pause``: the server's, which
        gives the probe's slot back while its idle confirmation waits."""
        asked = self.asked(query)
        if not isinstance(asked, Asked):
            return asked
        target, module = asked.target, asked.module
        collector = self.collector(asked, timeout_header, waited)
        started = time.monotonic()
        deadline = Deadline.after(collector.budget)
        observation = await MODULES[module].observe(self.client, target, deadline, collector.options,
                                                    known=self.models, pause=pause)
        body = render_series(await collector.series(observation, started, deadline))
        self.client.finished(target)  # until the next scrape
        _log_probe(target, module, collector.last_observation, time.monotonic() - started)
        return 200, CONTENT_TYPE_LATEST, body

    async def route(self, request: Request) -> Response:
        waited = time.monotonic() - request.received
        code, content_type, body = await self.answer(request.query, request.headers.get(SCRAPE_TIMEOUT_HEADER),
                                                     waited, request.slot.pause if request.slot else sleep)
        asked = self.asked(request.query)  # (kept: no second reading of the query)
        module = asked.module if isinstance(asked, Asked) else module_label(request.query)
        probes_counter(module, code).inc()
        PROBE_SECONDS.observe(time.monotonic() - request.received)
        return Response(code, content_type, body)

    def start_within(self, request: Request) -> float:
        """A probe may wait for a slot up to half its budget; the rest is the reading's."""
        return scrape_budget(request.headers.get(SCRAPE_TIMEOUT_HEADER), self.config) / 2

    def overloaded(self, request: Request) -> Response:
        probes_counter(module_label(request.query), 503).inc()
        return Response(503, TEXT, b"overloaded: every probe slot is busy (max_concurrent_probes); "
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
