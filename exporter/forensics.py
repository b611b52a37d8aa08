"""``GET /forensics?target=URL``: the stacks of a hung server's processes, asked over HTTP.

The exporter is the place that can see the server's processes (beside vLLM on the host, in
its PID namespace in compose, its sidecar on Kubernetes), so the webhook asks it for the
capture before a restart. Off unless ``forensics.enabled``; the target is validated and held to
``allow_targets`` as ``/probe`` is; the bounded check (the one behind ``/livez``) must say
``hung`` now, else 409 and nothing is captured; one capture per target at a time (503 for a
second caller meanwhile). The target's API key is scrubbed from the answer.
"""
from __future__ import annotations

import json
import logging
import threading

from hangwatch import liveness
from hangwatch.forensics.gate import capture_if_hung

from .config import ExporterConfig
from .health import validated
from .httpserver import Request, Response, Route

log = logging.getLogger("hangwatch.exporter")

JSON = "application/json"


def forensics_route(config: ExporterConfig) -> Route:
    running: set[str] = set()
    guard = threading.Lock()
    settings = config.forensics

    def handler(request: Request) -> Response:
        code, target, module = validated(request.query, config)
        if code:
            return Response(code, "text/plain; charset=utf-8", f"{target}\n".encode())
        with guard:
            if target in running:
                return Response(503, "text/plain; charset=utf-8", b"a capture of this target is under way\n")
            running.add(target)
        try:
            options = config.options_for(target)
            answer = capture_if_hung(
                target,
                lambda: getattr(liveness.bounded_check(
                    target, module=module, interval=config.liveness_interval, timeout=config.liveness_timeout,
                    budget=config.liveness_budget, api_key=options.api_key, probe=options.probe), "result", None),
                secrets=[options.api_key] if options.api_key else [], deadline=settings.deadline,
                native=settings.native, with_locals=settings.locals, py_spy=settings.py_spy)
        finally:
            with guard:
                running.discard(target)
        status = 200 if answer["captured"] else 409
        log.log(logging.WARNING if answer["captured"] else logging.INFO,
                "forensics target=%s code=%d verdict=%s signature=%s seconds=%s errors=%d", target, status,
                answer["verdict"], answer["signature"], answer.get("seconds"), len(answer["errors"]))
        return Response(status, JSON, (json.dumps(answer) + "\n").encode())

    return Route(handler, start_within=lambda request: config.liveness_budget / 4)
