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
from .httpserver import Request, Response, Route
from .query import Refused, asked

log = logging.getLogger("hangwatch.exporter")

JSON = "application/json"


def forensics_route(config: ExporterConfig) -> Route:
    running: set[str] = set()
    guard = threading.Lock()
    settings = config.forensics

    def handler(request: Request) -> Response:
        read = asked(request.query, config)
        if isinstance(read, Refused):
            return Response(read.code, "text/plain; charset=utf-8", f"{read.why}\n".encode())
        target, module, options = read.target, read.module, read.options
        with guard:
            if target in running:
                return Response(503, "text/plain; charset=utf-8", b"a capture of this target is under way\n")
            running.add(target)
        try:
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


class LivezCaptures:
    """On Kubernetes the kubelet restarts, not the webhook: the stacks are taken at the first
    ``/livez`` 503 of a target (the bounded check just said hung), in the background so the
    answer is not delayed, and logged as one JSON line (``kubectl logs`` of the sidecar keeps
    it across vLLM's restart). Once per incident: again only after a 200 for that target."""

    def __init__(self, config: ExporterConfig):
        self.config = config
        self._guard = threading.Lock()
        self._taken: set[str] = set()

    def seen(self, query: str, code: int) -> None:
        read = asked(query, self.config)
        if isinstance(read, Refused):
            return
        target = read.target
        with self._guard:
            if code != 503:
                self._taken.discard(target)
                return
            if target in self._taken:
                return
            self._taken.add(target)
        threading.Thread(target=self._capture, args=(target,), daemon=True,
                         name=f"hangwatch-forensics-{target}").start()

    def _capture(self, target: str) -> None:
        from hangwatch.forensics import capture
        settings, options = self.config.forensics, self.config.options_for(target)
        try:
            answer = capture(target, deadline=settings.deadline, native=settings.native,
                             with_locals=settings.locals, py_spy=settings.py_spy,
                             secrets=[options.api_key] if options.api_key else [])
        except Exception:  # noqa: BLE001 - capture never raises; a bug here must not kill the thread silently
            log.exception("forensics after /livez 503 of %s failed", target)
            return
        log.warning("forensics after /livez 503 target=%s signature=%s seconds=%s capture=%s", target,
                    answer["signature"], answer["seconds"], json.dumps({"verdict": "hung", **answer}))
