"""The exporter's HTTP face: ``/probe?target=&module=``, ``/metrics`` and a small index.

The blackbox_exporter pattern: each ``/probe`` reads its one target afresh, so no reading is
shared between scrapes or between Prometheus replicas. A bad request is 400, a target
outside the allowlist 403; a failing target is still 200 with ``hangwatch_up 0``.

``/probe`` sends requests wherever it is told, so it is no open relay: its query is read by
the one validator of every such route (``query.asked``): a target is ``scheme://host[:port]``
only (a base path only when that exact URL is in ``allow_targets``; never credentials, a
query or a fragment), and a query may narrow what the config allows for a target, never
widen it. Listening beyond loopback needs ``allow_targets`` or an explicit
``allow_any_target: true`` (exit 64 at start-up otherwise), and an API key goes only to the
URLs the config lists (``ExporterConfig.options_for``).

It serves thousands of backends from one process (bench/bench_exporter_scale.py): the
server is ``hangwatch.exporter.httpserver.BoundedHTTPServer`` (one event loop for every connection,
at most ``max_concurrent_probes`` probes at once); a busy backend's probe is read, parsed and
rendered on that loop (``Prober.on_loop``, ``hangwatch.exporter.loopfetch``: no thread hand-off), the
rest on worker threads; a probe reuses an idle keep-alive connection, an engine's version is
asked once per process (``reuse.VersionCache``), and the text format is rendered directly
(``collector.render_series``).

A probe that cannot start within half its scrape budget — every worker busy — is answered
503 at that moment, not 200 with ``hangwatch_up 0``: the backend was never asked, and
``up 0`` would tell the rules it is down or stalled (twice in a row reads as hung). A 503
is a failed scrape: Prometheus marks the target's series stale and the rules see a gap,
which is no verdict, while ``hangwatch_exporter_probes_total{code="503"}`` tells people.

To add a route, add a row to ``routes()``: a handler ``Request -> Response``, ``inline``
when it never blocks, else it runs on a probe worker under the same limit (or starts on the
loop: ``on_loop``, as ``/probe`` does).
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import os
import platform
import resource
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hangwatch import __version__, logs
from hangwatch.fetch import Client, Deadline
from hangwatch.modules import MODULES
from hangwatch.observe import metrics_observation, observe_load, probe_due, read_metrics
from hangwatch.probe import send_probe
from hangwatch.settings import EXIT_CONFIG, ConfigError, listen_address

from . import evloop
from . import query as queries
from .collector import BackendCollector, render_series
from .config import ExporterConfig, load_exporter_config
from .forensics import LivezCaptures, forensics_route
from .health import answer_health, shared_checks
from .httpserver import BoundedHTTPServer, Request, Response, Route
from .loopfetch import LoopClient
from .query import Asked, Refused
from .reuse import VersionCache

# Idle keep-alive connections kept to the backends (LRU): the same backends are read every
# scrape interval, and a new TCP connection per scrape is wasted work on both sides.
IDLE_CONNECTIONS = 256       # the worker threads' pool (idle probes, versions, host names, TLS)
# The loop's pool (every busy backend's reading) is larger, and not for reuse alone: a backend
# closes an idle connection itself after its keep-alive (vLLM's uvicorn: 5 s), so a pool that
# holds connections longer than that leaves the closing to the backend, and its TIME_WAIT on the
# backend's side. A pool too small for the scrape rate closes them first: measured at 5,000
# backends over 15 s (333 scrapes/s), 256 kept left ~20,000 sockets in TIME_WAIT here and
# connect() paid for it (kernel 47% of 1.03 ms per scrape); 4,096 kept: 29% of 0.84 ms.
# 2,048 covers 400 scrapes a second against a 5 s keep-alive; it shrinks to what the
# file-descriptor limit leaves (``loop_pool_size``).
LOOP_IDLE_CONNECTIONS = 2048
QUERIES = 20000  # parsed /probe queries kept (one per target and module; ~300 bytes each)
MAX_KEPT_QUERY = 512

log = logging.getLogger("hangwatch.exporter")

PROBES = Counter("hangwatch_exporter_probes", "Probe requests answered, by module and HTTP code.",
                 ["module", "code"])
PROBE_SECONDS = Histogram("hangwatch_exporter_probe_duration_seconds", "Time to answer /probe.")
# node_exporter's build_info: which hangwatch (and Python) answers, as labels on a constant 1.
Info("hangwatch_build", "The hangwatch version and the Python it runs on.").info(
    {"version": __version__, "python_version": platform.python_version()})

INDEX = b"""<html><head><title>hangwatch exporter</title></head><body>
<h1>hangwatch exporter</h1>
<p>Reads a model server's own /metrics and says idle, busy or hung, without consuming its slots.</p>
<ul><li><a href="/metrics">/metrics</a> (the exporter's own health)</li>
<li>/probe?target=http://127.0.0.1:8000&amp;module=backend (module: backend or proxy)</li>
<li>/livez?target=...&amp;module=... (503 only when hung: a kubelet's liveness probe)</li>
<li>/readyz?target=...&amp;module=... (503 unless it can take work now: a readiness probe)</li></ul>
</body></html>
"""
TEXT = "text/plain; charset=utf-8"


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
        self.queries: dict[str, Asked] = {}   # asked(): /probe query -> its parsed, checked meaning
        self._queries_lock = threading.Lock()

    def asked(self, query: str) -> Asked | tuple[int, str, bytes]:
        """What a /probe query asks (``query.asked``: target, module, options), or the 400/403 answer.

        Prometheus sends each target the same query every scrape, and the answer depends on
        nothing else (the config is fixed), so it is kept: at most ``QUERIES`` good ones of at
        most ``MAX_KEPT_QUERY`` characters."""
        known = self.queries.get(query)
        if known is None:
            read = queries.asked(query, self.config)
            if isinstance(read, Refused):
                return read.code, TEXT, f"{read.why}\n".encode()
            known = read
            if len(query) > MAX_KEPT_QUERY:
                return known  # only good, short queries are kept: a client cannot fill memory
            with self._queries_lock:  # workers ask too (the paths that are not read on the loop)
                while len(self.queries) >= QUERIES:
                    self.queries.pop(next(iter(self.queries)))  # the oldest (dicts keep insertion order)
                self.queries[query] = known
        return known

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
        observation = MODULES[module].observe(self.client, target, deadline, collector.options)
        body = render_series(collector.series(observation, started, deadline))
        _log_probe(target, module, collector.last_observation, time.monotonic() - started)
        return 200, CONTENT_TYPE_LATEST, body

    def route(self, request: Request) -> Response:
        waited = time.monotonic() - request.received
        code, content_type, body = self.answer(
            request.query, request.headers.get("x-prometheus-scrape-timeout-seconds"), waited)
        asked = self.asked(request.query)  # (kept: no second reading of the query)
        module = asked.module if isinstance(asked, Asked) else module_label(request.query)
        return self._counted(request, module, code, content_type, body)

    def _counted(self, request: Request, module: str, code: int, content_type: str, body: bytes) -> Response:
        _probes_counter(module, code).inc()
        PROBE_SECONDS.observe(time.monotonic() - request.received)
        return Response(code, content_type, body)

    def on_loop(self, request: Request, reply) -> None:
        """A busy backend's probe without a thread: its /metrics read on the server's loop
        (``hangwatch.exporter.loopfetch``), parsed and rendered there. Anything that would block — the
        idle probe, the engine's version not yet known, a host name to resolve, TLS, another
        module — is handed to a worker, which does what ``route`` does from where this stopped."""
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
        collector = self.collector(asked, request.headers.get("x-prometheus-scrape-timeout-seconds"),
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
        """The rest of ``observe_backend`` after its /metrics read, then the series (``answer``'s)."""
        observation = observe_load(self.client, collector.target, deadline, collector.options,
                                   read=read_metrics, probe=send_probe, first=observation)
        return self._rendered(request, collector, observation, started, deadline)

    def _rendered(self, request: Request, collector: BackendCollector, observation, started: float,
                  deadline: Deadline, version: str | None = None) -> Response:
        body = render_series(collector.series(observation, started, deadline, version))
        _log_probe(collector.target, collector.module, collector.last_observation, time.monotonic() - started)
        return self._counted(request, collector.module, 200, CONTENT_TYPE_LATEST, body)

    def start_within(self, request: Request) -> float:
        """A probe may wait for a worker up to half its budget; the rest is the reading's."""
        return scrape_budget(request.headers.get("x-prometheus-scrape-timeout-seconds"), self.config) / 2

    def overloaded(self, request: Request) -> Response:
        _probes_counter(module_label(request.query), 503).inc()
        return Response(503, TEXT, b"overloaded: every probe worker is busy (max_concurrent_probes); "
                                   b"not a verdict on the target\n")


@functools.lru_cache(maxsize=64)
def _probes_counter(module: str, code: int):
    """``PROBES``' child for a module and code, looked up once (a handful of pairs exist: the
    modules, plus "invalid", times the codes the exporter answers)."""
    return PROBES.labels(module, str(code))


def answer_probe(query: str, timeout_header: str | None, config: ExporterConfig) -> tuple[int, str, bytes]:
    """One /probe answer outside the server (a fresh Prober: nothing reused)."""
    return Prober(config).answer(query, timeout_header)


def _log_probe(target: str, module: str, observation, seconds: float) -> None:
    """One line per probe at debug level (``--log-level debug``): what was read and whether the
    idle probe went out. The target is ``scheme://host[:port]``; no key or header is logged."""
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


def own_metrics(request: Request) -> Response:
    return Response(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))


def index(request: Request) -> Response:
    return Response(200, "text/html; charset=utf-8", INDEX)


def health_route(endpoint: str, config: ExporterConfig, checks) -> Route:
    """``/livez`` or ``/readyz``: one bounded check per target, shared by concurrent callers.
    Overloaded (no worker free at once), liveness says alive — a restart needs proof of a hang —
    and readiness says not ready."""
    captures = LivezCaptures(config) if endpoint == "livez" and config.forensics.enabled else None

    def handler(request: Request) -> Response:
        answer = answer_health(endpoint, request.query, config, checks)
        if captures is not None:  # the stacks at the first 503 (docs/kubernetes.md)
            captures.seen(request.query, answer[0])
        return Response(*answer)

    def overloaded(request: Request) -> Response:
        code = 200 if endpoint == "livez" else 503
        return Response(code, TEXT, b"overloaded: no worker free to check; not a verdict on the target\n")
    return Route(handler, start_within=lambda request: config.liveness_budget / 4, overloaded=overloaded)


def routes(config: ExporterConfig, prober: Prober) -> dict[str, Route]:
    checks = shared_checks(config)  # /livez and /readyz share one bounded check per target
    extra = {"/forensics": forensics_route(config)} if config.forensics.enabled else {}
    return extra | {
        "/probe": Route(prober.route, start_within=prober.start_within, overloaded=prober.overloaded,
                        on_loop=prober.on_loop),
        "/livez": health_route("livez", config, checks),
        "/readyz": health_route("readyz", config, checks),
        "/metrics": Route(own_metrics, inline=True),
        "/": Route(index, inline=True),
    }


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
        yield GaugeMetricFamily("hangwatch_exporter_probes_waiting", "Probes waiting for a free worker.",
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


def make_server(listen: str, config: ExporterConfig) -> BoundedHTTPServer:
    prober = Prober(config)
    server = BoundedHTTPServer(listen_address(listen), routes(config, prober),
                               max_connections=config.max_connections, read_timeout=config.read_timeout,
                               workers=config.max_concurrent_probes, name="hangwatch-exporter")
    SERVERS.servers = [s for s in SERVERS.servers if s.socket.fileno() != -1] + [server]
    return server


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_exposure(listen: str, config: ExporterConfig) -> None:
    """Beyond loopback, /probe must not read any URL anyone sends it unless that is chosen."""
    host, _ = listen_address(listen)
    if not is_loopback(host) and not config.allow_targets and not config.allow_any_target:
        raise ConfigError(
            f"allow_targets: required when listening on {listen} (not loopback): /probe would read any URL "
            "anyone who reaches it sends; list the backends in allow_targets, or set allow_any_target: true")


def _fds_besides_the_loop_pool(config: ExporterConfig) -> int:
    # Every allowed client connection; per probe up to three sockets (the reading, a probe, a
    # version); the threads' idle pool; files, pipes and the listening socket.
    return config.max_connections + IDLE_CONNECTIONS + 3 * config.max_concurrent_probes + 64


def loop_pool_size(config: ExporterConfig) -> int:
    """``LOOP_IDLE_CONNECTIONS``, or what the file-descriptor limit leaves beside everything
    else the exporter may hold open: a kept idle connection must never cost a probe its socket."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return LOOP_IDLE_CONNECTIONS
    return max(0, min(LOOP_IDLE_CONNECTIONS, soft - _fds_besides_the_loop_pool(config)))


def raise_fd_limit(config: ExporterConfig) -> None:
    """Room for every allowed connection, idle backend connection and probe (the soft limit is often 1024)."""
    needed = _fds_besides_the_loop_pool(config) + LOOP_IDLE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < needed:
            log.warning("only %d file descriptors (hard limit); max_connections %d needs about %d",
                        new, config.max_connections, needed)


def main(args) -> int:
    try:
        logs.setup(logs.resolve_level(getattr(args, "log_level", None)), getattr(args, "log_format", "text"))
        config = load_exporter_config(args.config)
        check_exposure(args.listen, config)
        raise_fd_limit(config)
        server = make_server(args.listen, config)
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch exporter: {exc}\n")
        return EXIT_CONFIG
    except OSError as exc:
        sys.stderr.write(f"hangwatch exporter: cannot listen on {args.listen}: {exc.strerror}\n")
        return EXIT_CONFIG
    host, port = server.server_address[:2]

    def announce() -> None:
        log.info("hangwatch %s listening on http://%s:%s (allow_targets: %s; max_connections %d, "
                 "max_concurrent_probes %d)", __version__, host, port, _allowed(config), config.max_connections,
                 config.max_concurrent_probes)
    return serve_until_signalled(server, announce)


def serve_until_signalled(server: BoundedHTTPServer, announce: Callable[[], None] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop at once: 0 (1 if the server itself failed).

    ``announce`` (the "listening" line) runs only once the handlers are in place: a supervisor or
    test that signals as soon as it reads that line must not meet the default action (measured in
    CI: a SIGTERM straight after the line killed the exporter with -15 instead of a clean 0).

    As PID 1 in a container a process gets no default signal handling, so without a handler
    ``docker stop`` waited its full 10 s and then killed the exporter. The exporter holds no
    state: a probe still reading a backend is abandoned (that scrape fails, which Prometheus
    records as a gap, not a verdict), and the process exits without waiting for it.
    """
    # The handler only notes the signal: it runs between two bytecodes of the main thread, which
    # may hold the very lock an Event.set() would take (measured: a SIGTERM that deadlocked the
    # exporter until it was killed). The wake-up fd, written by the C-level handler, ends the wait.
    signalled: list[int] = []
    serving = threading.Thread(target=server.serve_forever, name="hangwatch-exporter-loop", daemon=True)
    in_main = threading.current_thread() is threading.main_thread()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous_wakeup = None
    if in_main:
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: signalled.append(signum))
    serving.start()
    if announce is not None:
        announce()
    try:
        while serving.is_alive() and not signalled:
            select.select([wake_read], [], [], 1.0)
            try:
                os.read(wake_read, 64)
            except BlockingIOError:
                pass
    finally:
        if in_main:
            signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_read)
        os.close(wake_write)
    failed = not serving.is_alive() and not signalled
    if signalled:
        log.info("stopping (signal)")
    server.shutdown()
    abandoned = server.stats.work_running
    server.server_close()
    if failed:
        log.error("the server loop ended on its own; exiting 1")
        return 1
    log.info("exporter stopped%s", f"; abandoned {abandoned} probe(s) in progress" if abandoned else "")
    if abandoned and in_main:
        # The probe threads are the executor's, which the interpreter joins at exit: up to a scrape
        # budget for a stalled backend. Nothing they hold needs closing (sockets die with us).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _allowed(config: ExporterConfig) -> str:
    if config.allow_targets:
        return f"{len(config.allow_targets)} URL(s)"
    return "any (allow_any_target)" if config.allow_any_target else "any (loopback only)"

