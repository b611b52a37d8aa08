"""``GET /forensics?target=URL``: the stacks of a hung server's processes, asked over HTTP.

The exporter is the place that can see the server's processes (beside vLLM on the host, in
its PID namespace in compose, its sidecar on Kubernetes), so the webhook asks it for the
capture before a restart. Off unless ``forensics.enabled``; then only for a target the config
lists exactly (in any spelling of its address: ``targets.canonical_url``), with the bearer
token when ``forensics.token_file`` is set (401 without); the bounded check (the one behind
``/livez``) must say ``hung`` now, else 409 and nothing is captured. One guard per exporter,
shared with the ``/livez`` captures: one capture per target at a time (503 meanwhile) and per
``forensics.min_interval`` (429, Retry-After). The target's API key is scrubbed from the answer.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlencode

from hangwatch import liveness
from hangwatch.forensics.gate import capture_if_hung
from hangwatch.forensics.guard import CaptureGuard
from hangwatch.forensics.pins import CONTAINER_ID
from hangwatch.forensics.targets import TargetError, canonical_url

from .config import ExporterConfig
from .httpserver import Request, Response, Route
from .query import Refused, asked

log = logging.getLogger("hangwatch.exporter")

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"

# A capture blocks (it reads /proc, runs py-spy, waits on a bounded check of its own): it runs on
# these threads, never on the server's loop. Made when first used; at most this many at once
# (the CaptureGuard allows one per target), the rest wait for one.
BLOCKING_WORKERS = 2
BLOCKING = ThreadPoolExecutor(max_workers=BLOCKING_WORKERS, thread_name_prefix="hangwatch-blocking")


def capture_guard(config: ExporterConfig) -> CaptureGuard:
    return CaptureGuard(config.forensics.min_interval)


def capture_args(config: ExporterConfig, canonical: str, options) -> dict:
    """What every capture of this exporter reads and how far: the settings, the target's pin, its key."""
    settings = config.forensics
    return {"secrets": [options.api_key] if options.api_key else [], "deadline": settings.deadline,
            "native": settings.native, "with_locals": settings.locals, "py_spy": settings.py_spy,
            "pin": settings.pin_for(canonical), "max_processes": settings.max_processes,
            "max_concurrent": settings.max_concurrent, "max_output_bytes": settings.max_output_bytes}


def listed_target(query: str, config: ExporterConfig) -> tuple[str, str] | Refused:
    """(the listed URL, its canonical form) for a query's target, or why not (400, 403)."""
    targets = parse_qs(query, keep_blank_values=True).get("target", [])
    if len(targets) != 1:
        return Refused(400, "exactly one target= is required")
    try:
        canonical = canonical_url(targets[0])
    except TargetError as exc:
        return Refused(400, f"target: the URL {exc}")
    listed = config.listed_exactly(canonical)
    if listed is None:
        return Refused(403, "target is not listed exactly in allow_targets or targets (forensics captures only those)")
    return listed, canonical


def authorized(request: Request, config: ExporterConfig) -> bool:
    token = config.forensics.token
    if token is None:
        return True
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), token.encode())


def forensics_route(config: ExporterConfig, guard: CaptureGuard) -> Route:
    async def handler(request: Request) -> Response:
        return await asyncio.get_running_loop().run_in_executor(BLOCKING, answer, request)

    def answer(request: Request) -> Response:
        if not authorized(request, config):
            return Response(401, TEXT, b"forensics needs the bearer token (forensics.token_file)\n",
                            (("WWW-Authenticate", "Bearer"),))
        found = listed_target(request.query, config)
        if isinstance(found, Refused):
            return Response(found.code, TEXT, f"{found.why}\n".encode())
        listed, canonical = found
        params = parse_qs(request.query, keep_blank_values=True)
        containers = params.pop("container", [])
        if len(containers) > 1 or (containers and not CONTAINER_ID.fullmatch(containers[0])):
            return Response(400, TEXT, b"container: expected one Docker container ID (12 to 64 hex digits)\n")
        read = asked(urlencode(params | {"target": [listed]}, doseq=True), config)
        if isinstance(read, Refused):
            return Response(read.code, TEXT, f"{read.why}\n".encode())
        module, options = read.module, read.options
        with guard.holding(canonical) as refusal:
            if refusal is not None:
                return Response(refusal.code, TEXT, f"{refusal.why}\n".encode(),
                                (("Retry-After", str(refusal.retry_after)),))
            answer = capture_if_hung(
                listed,
                lambda: getattr(liveness.bounded_check(
                    listed, module=module, interval=config.liveness_interval, timeout=config.liveness_timeout,
                    budget=config.liveness_budget, api_key=options.api_key, probe=options.probe), "result", None),
                container=containers[0] if containers else None,
                container_trusted=config.forensics.token is not None,  # the caller showed the token
                **capture_args(config, canonical, options))
        status = 200 if answer["captured"] else 409
        log.log(logging.WARNING if answer["captured"] else logging.INFO,
                "forensics target=%s code=%d verdict=%s signature=%s netns=%s seconds=%s errors=%d", listed, status,
                answer["verdict"], answer["signature"], ",".join(answer.get("netns") or ()) or "-",
                answer.get("seconds"), len(answer["errors"]))
        return Response(status, JSON, (json.dumps(answer) + "\n").encode())

    return Route(handler, start_within=lambda request: config.liveness_budget / 4)


class LivezCaptures:
    """On Kubernetes the kubelet restarts, not the webhook: the stacks are taken at the first
    ``/livez`` 503 of a target (the bounded check just said hung), on one of the ``BLOCKING``
    threads so the answer is not delayed. The log gets the signature and a summary (the whole capture, locals
    and all, only at debug level). Once per incident — again only after a 200 for that target —
    and never past the guard ``/forensics`` shares."""

    def __init__(self, config: ExporterConfig, guard: CaptureGuard):
        self.config = config
        self.guard = guard
        self._mutex = threading.Lock()
        self._taken: set[str] = set()

    def seen(self, query: str, code: int) -> None:
        found = listed_target(query, self.config)
        if isinstance(found, Refused) or isinstance(asked(query, self.config), Refused):
            return
        listed, canonical = found
        with self._mutex:
            if code != 503:
                self._taken.discard(canonical)
                return
            if canonical in self._taken:
                return
            self._taken.add(canonical)
        BLOCKING.submit(self._capture, listed, canonical)

    def _capture(self, listed: str, canonical: str) -> None:
        """On a ``BLOCKING`` thread."""
        from hangwatch.forensics import capture
        options = self.config.options_for(listed)
        with self.guard.holding(canonical) as refusal:
            if refusal is not None:
                log.info("forensics after /livez 503 target=%s skipped: %s", listed, refusal.why)
                return
            try:
                answer = capture(listed, **capture_args(self.config, canonical, options))
            except Exception:  # noqa: BLE001 - capture never raises; a bug here must not kill the thread silently
                log.exception("forensics after /livez 503 of %s failed", listed)
                return
        log.warning("forensics after /livez 503 target=%s signature=%s processes=%d netns=%s seconds=%s errors=%d "
                    "(the whole capture at debug level)", listed, answer["signature"], len(answer["processes"]),
                    ",".join(answer.get("netns") or ()) or "-", answer["seconds"], len(answer["errors"]))
        log.debug("forensics after /livez 503 target=%s capture=%s", listed, json.dumps({"verdict": "hung", **answer}))
