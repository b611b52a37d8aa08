"""The exporter's routes in one table: a path, its handler, and how it waits for a worker.

To add a route, add a row to ``routes()``: a handler ``Request -> Response``, ``inline`` when
it is cheap and never blocks, else a coroutine function awaited on the loop under the same limit
as probes (``max_concurrent_probes``). Work that truly blocks goes to a bounded executor
(``forensics.BLOCKING``), never the loop.
"""
from __future__ import annotations

from .config import ExporterConfig
from .forensics import LivezCaptures, capture_guard, forensics_route
from .health import answer_health, overloaded, shared_checks
from .httpserver import Request, Response, Route
from .prober import Prober
from .selfmetrics import own_metrics

INDEX = b"""<html><head><title>hangwatch exporter</title></head><body>
<h1>hangwatch exporter</h1>
<p>Reads a model server's own /metrics and says idle, busy or hung, without consuming its slots.</p>
<ul><li><a href="/metrics">/metrics</a> (the exporter's own health)</li>
<li>/probe?target=http://127.0.0.1:8000&amp;module=backend (module: backend or proxy)</li>
<li>/livez?target=...&amp;module=... (503 only when hung: a kubelet's liveness probe)</li>
<li>/readyz?target=...&amp;module=... (503 unless it can take work now: a readiness probe)</li></ul>
</body></html>
"""


def index(request: Request) -> Response:
    return Response(200, "text/html; charset=utf-8", INDEX)


def health_route(endpoint: str, config: ExporterConfig, checks, guard=None) -> Route:
    """``/livez`` or ``/readyz``: one bounded check per target, shared by concurrent callers.
    Overloaded (no slot free in time), liveness says alive — a restart needs proof of a hang —
    and readiness says not ready."""
    captures = LivezCaptures(config, guard) if endpoint == "livez" and guard is not None else None

    async def handler(request: Request) -> Response:
        # The check is a task of its own, shared, that mostly sleeps between its readings (2 s
        # apart, up to 9 s): waiting for it holds no slot. The slot admitted this request.
        if request.slot is not None:
            request.slot.release()
        answer = await answer_health(endpoint, request.query, config, checks)
        if captures is not None:  # the stacks at the first 503 (docs/kubernetes.md)
            captures.seen(request.query, answer[0])
        return Response(*answer)

    return Route(handler, start_within=lambda request: config.liveness_budget / 4,
                 overloaded=lambda request: Response(*overloaded(endpoint)))


def routes(config: ExporterConfig, prober: Prober) -> dict[str, Route]:
    checks = shared_checks(config)  # /livez and /readyz share one bounded check per target
    guard = capture_guard(config) if config.forensics.enabled else None  # one per exporter: every capture's
    extra = {"/forensics": forensics_route(config, guard)} if guard is not None else {}
    return extra | {
        "/probe": Route(prober.route, start_within=prober.start_within, overloaded=prober.overloaded),
        "/livez": health_route("livez", config, checks, guard),
        "/readyz": health_route("readyz", config, checks),
        "/metrics": Route(own_metrics, inline=True),
        "/": Route(index, inline=True),
    }
