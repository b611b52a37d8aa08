"""The exporter's HTTP face: ``/probe?target=&module=``, ``/metrics`` and a small index.

The blackbox_exporter pattern: each ``/probe`` builds a fresh registry for one target, so
nothing is shared between scrapes or between Prometheus replicas. A bad request is 400, a
target outside the allowlist 403; a failing target is still 200 with ``hangwatch_up 0``.
It listens on loopback by default because ``/probe`` sends requests wherever it is told.
"""
from __future__ import annotations

import logging
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest

from .collector import BackendCollector
from hangwatch.fetch import Client
from hangwatch.httpserver import QuietThreadingHTTPServer
from hangwatch.modules import MODULES as OBSERVERS
from hangwatch.observation import PROBE_KINDS
from hangwatch.settings import EXIT_CONFIG, ConfigError, http_url, listen_address

from .config import ExporterConfig, load_exporter_config
from .health import answer_health, shared_checks

# Keep-alive connections to the backends, shared by every scrape (the same backends are read
# every scrape interval; a new TCP connection per scrape is wasted work on both sides).
CLIENT = Client(max_idle=256)

log = logging.getLogger("hangwatch.exporter")

PROBES = Counter("hangwatch_exporter_probes", "Probe requests answered, by module and HTTP code.",
                 ["module", "code"])
PROBE_SECONDS = Histogram("hangwatch_exporter_probe_duration_seconds", "Time to answer /probe.")

INDEX = b"""<html><head><title>hangwatch exporter</title></head><body>
<h1>hangwatch exporter</h1>
<p>Reads a model server's own /metrics and says idle, busy or hung, without consuming its slots.</p>
<ul><li><a href="/metrics">/metrics</a> (the exporter's own health)</li>
<li>/probe?target=http://127.0.0.1:8000&amp;module=backend (module: backend or proxy)</li>
<li>/livez?target=...&amp;module=... (503 only when hung: a kubelet's liveness probe)</li>
<li>/readyz?target=...&amp;module=... (503 unless it can take work now: a readiness probe)</li></ul>
</body></html>
"""


def scrape_budget(header: str | None, config: ExporterConfig) -> float:
    """Prometheus' scrape timeout minus an offset, or the configured default."""
    try:
        budget = min(float(header) - config.timeout_offset, config.timeout)
    except (TypeError, ValueError):
        budget = config.timeout
    return max(0.2, budget if budget == budget else config.timeout)


def answer_probe(query: str, timeout_header: str | None, config: ExporterConfig) -> tuple[int, str, bytes]:
    params = parse_qs(query, keep_blank_values=True)
    targets, modules = params.get("target", []), params.get("module", ["backend"])
    probes = params.get("probe", [""])
    if len(targets) != 1 or len(modules) != 1 or len(probes) != 1:
        return 400, "text/plain", b"exactly one target= (and at most one module= and probe=) is required\n"
    module = modules[0] or "backend"
    if module not in OBSERVERS:
        return 400, "text/plain", f"unknown module {module!r} (known: {', '.join(OBSERVERS)})\n".encode()
    probe = probes[0] or None
    if probe is not None and probe not in PROBE_KINDS:
        return 400, "text/plain", f"unknown probe {probe!r} (known: {', '.join(PROBE_KINDS)})\n".encode()
    try:
        target = http_url(targets[0], "target")
    except ConfigError as exc:
        return 400, "text/plain", f"{exc}\n".encode()
    if not config.allows(target):
        return 403, "text/plain", b"target is not in the exporter's allow_targets\n"
    registry = CollectorRegistry(auto_describe=False)
    collector = BackendCollector(target, module, scrape_budget(timeout_header, config),
                                 config.options_for(target, probe), CLIENT)
    registry.register(collector)
    body = generate_latest(registry)
    observation = collector.last_observation
    log.debug("probe target=%s module=%s status=%s", target, module, observation and observation.status)
    return 200, CONTENT_TYPE_LATEST, body


def make_handler(config: ExporterConfig):
    checks = shared_checks(config)  # /livez and /readyz share one bounded check per target

    class Handler(BaseHTTPRequestHandler):
        server_version = "hangwatch-exporter"

        def do_GET(self):
            url = urlsplit(self.path)
            started = time.monotonic()
            if url.path == "/probe":
                code, content_type, body = answer_probe(
                    url.query, self.headers.get("X-Prometheus-Scrape-Timeout-Seconds"), config)
                module = parse_qs(url.query).get("module", ["backend"])[0]
                PROBES.labels(module if module in OBSERVERS else "invalid", str(code)).inc()
                PROBE_SECONDS.observe(time.monotonic() - started)
            elif url.path in ("/livez", "/readyz"):
                code, content_type, body = answer_health(url.path[1:], url.query, config, checks)
            elif url.path == "/metrics":
                code, content_type, body = 200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
            elif url.path == "/":
                code, content_type, body = 200, "text/html; charset=utf-8", INDEX
            else:
                code, content_type, body = 404, "text/plain", b"not found\n"
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler


def make_server(listen: str, config: ExporterConfig) -> ThreadingHTTPServer:
    return QuietThreadingHTTPServer(listen_address(listen), make_handler(config))


def main(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_exporter_config(args.config)
        server = make_server(args.listen, config)
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch exporter: {exc}\n")
        return EXIT_CONFIG
    except OSError as exc:
        sys.stderr.write(f"hangwatch exporter: cannot listen on {args.listen}: {exc.strerror}\n")
        return EXIT_CONFIG
    host, port = server.server_address[:2]
    log.info("listening on http://%s:%s (allow_targets: %s)", host, port,
             ", ".join(config.allow_targets) or "any")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
