"""``hangwatch webhook``: the Alertmanager receiver that restarts only what it proves hung.

``create_app`` is a Flask app factory taking every collaborator (Docker client, clock,
re-checker, ledger), so tests run it with fakes; ``main`` alone builds the real ones.
``POST /alerts`` checks the token before reading the body, validates the v4 payload,
triages each alert in the request (cheap: labels against the config, one Docker lookup
under a deadline) and hands the slow part (re-check, restart) to the per-target worker,
answering within a second. Answers: 200 handled or deliberately ignored, 400 bad payload,
401 bad token, 503 Docker unreachable (Alertmanager retries only 5xx).
"""
from __future__ import annotations

import concurrent.futures
import hmac
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from hangwatch.settings import ConfigError, listen_address

from .config import Config, load_config, load_token
from .decide import REASONS, SKIP, Decider, EngineError, Job
from .ledger import Ledger
from .metrics import CONTENT_TYPE, WebhookMetrics
from .payload import BadPayload, parse_payload
from .worker import Worker

log = logging.getLogger("hangwatch.webhook")

MAX_BODY_BYTES = 4 * 1024 * 1024
ENGINE_DEADLINE = 0.8  # seconds the request may wait for Docker (Alertmanager wants an answer fast)
EXIT_CONFIG = 64


@dataclass
class WebhookState:
    """What the app holds; tests reach it as ``app.extensions["hangwatch"]``."""
    config: Config
    decider: Decider
    worker: Worker
    ledger: Ledger
    metrics: WebhookMetrics
    engine_pool: concurrent.futures.ThreadPoolExecutor

    def wait_idle(self, timeout: float) -> bool:
        return self.worker.wait_idle(timeout)

    def close(self) -> None:
        self.engine_pool.shutdown(wait=False, cancel_futures=True)
        self.ledger.close()


def create_app(config: Config, *, token: str, docker_client, clock=time.time, rechecker=None,
               dry_run: bool | None = None, ledger: Ledger | None = None, replica: str | None = None,
               engine_deadline: float = ENGINE_DEADLINE) -> Flask:
    if rechecker is None:
        from hangwatch.check import check as rechecker
    ledger = ledger or Ledger(config.state_dir)
    holder: dict = {}
    metrics = WebhookMetrics(lambda: holder["decider"].circuit_open(), lambda: holder["worker"].in_progress())
    metrics.preset([target.name for target in config.targets], REASONS)
    decider = Decider(config, docker_client=docker_client, clock=clock, rechecker=rechecker, ledger=ledger,
                      metrics=metrics, dry_run=config.dry_run if dry_run is None else dry_run, replica=replica)
    worker = Worker(decider.run)
    holder.update(decider=decider, worker=worker)
    state = WebhookState(config, decider, worker, ledger, metrics,
                         concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="hangwatch-docker"))
    expected = token.encode()

    app = Flask("hangwatch.webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["hangwatch"] = state

    def authorized() -> bool:
        scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
        given = credentials.strip().encode("utf-8", errors="replace")
        return hmac.compare_digest(given, expected) and scheme.lower() == "bearer"

    def unauthorized() -> Response:
        response = jsonify(error="missing or wrong bearer token")
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Bearer realm="hangwatch"'
        return response

    @app.after_request
    def count(response: Response) -> Response:
        metrics.requests.labels(str(response.status_code)).inc()
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        return jsonify(error=exc.name), exc.code

    @app.errorhandler(Exception)
    def crashed(exc: Exception):  # never a traceback page; logged once
        log.exception("unhandled error in %s %s", request.method, request.path)
        return jsonify(error="internal error"), 500

    @app.post("/alerts")
    def alerts():
        if not authorized():  # before the body is read or parsed
            return unauthorized()
        body = request.get_data(cache=False)
        log.debug("payload: %r", body[:4096])
        try:
            parsed = parse_payload(body)
        except BadPayload as exc:
            log.info("rejected payload: %s", exc)
            return jsonify(error=str(exc)), 400
        candidates = [(alert, target) for alert in parsed if (target := decider.triage(alert)) is not None]
        if not candidates:
            return jsonify(alerts=len(parsed), queued=[])
        targets = {target.name: target for _, target in candidates}
        future = state.engine_pool.submit(_lookup_all, decider, list(targets.values()))
        try:
            found = future.result(timeout=engine_deadline)
        except (EngineError, concurrent.futures.TimeoutError) as exc:
            detail = str(exc) or f"no answer within {engine_deadline:g}s"
            for alert, target in candidates:
                decider.record(alert, target, SKIP, "docker_unreachable", detail)
            return jsonify(error="docker engine unreachable; retry later"), 503
        queued = []
        for alert, target in candidates:
            if not found[target.name]:
                decider.record(alert, target, SKIP, "container_not_found")
            elif worker.submit(target.name, Job(alert, target)):
                queued.append(target.name)
            else:
                decider.record(alert, target, SKIP, "duplicate", "a job for this target is already in progress")
        return jsonify(alerts=len(parsed), queued=queued)

    @app.post("/circuit/<name>/reset")
    def reset(name: str):
        if not authorized():
            return unauthorized()
        target = config.target(name)
        if target is None:
            return jsonify(error="unknown target"), 404
        decider.reset_circuit(target)
        return jsonify(target=target.name, reset=True)

    @app.get("/metrics")
    def self_metrics():
        return Response(metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok", dry_run=decider.dry_run, targets=len(config.targets),
                       jobs_in_progress=worker.in_progress())

    return app


def _lookup_all(decider: Decider, targets) -> dict[str, bool]:
    """Does Docker know each target's container? Raises EngineError if Docker cannot say."""
    from docker.errors import NotFound
    found = {}
    for target in targets:
        try:
            decider.container(target)
            found[target.name] = True
        except NotFound:
            found[target.name] = False
    return found


class LazyDocker:
    """``docker.from_env()`` on first use, retried until it works: the engine may start after us."""

    def __init__(self, timeout: float = 30.0):
        self._timeout = timeout
        self._client = None
        self._lock = threading.Lock()

    @property
    def containers(self):
        with self._lock:
            if self._client is None:
                import docker
                self._client = docker.from_env(timeout=self._timeout)
            return self._client.containers


def main(args) -> int:
    level = os.environ.get("HANGWATCH_LOG_LEVEL", "info").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
        token = load_token(config)
        host, port = listen_address(args.listen)
        try:
            ledger = Ledger(config.state_dir)
        except OSError as exc:
            raise ConfigError(f"state_dir: cannot use {config.state_dir}: {exc.strerror or exc}") from None
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch webhook: {exc}\n")
        return EXIT_CONFIG
    dry_run = bool(config.dry_run or args.dry_run)
    app = create_app(config, token=token, docker_client=LazyDocker(), ledger=ledger, dry_run=dry_run)
    from werkzeug.serving import make_server
    try:
        server = make_server(host, port, app, threaded=True)
    except OSError as exc:
        sys.stderr.write(f"hangwatch webhook: cannot listen on {args.listen}: {exc.strerror or exc}\n")
        return 1

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("webhook listening on http://%s:%d (targets: %s; dry_run=%s; state_dir=%s)", host, server.port,
             ",".join(t.name for t in config.targets), str(dry_run).lower(), config.state_dir)
    server.serve_forever()
    state = app.extensions["hangwatch"]
    longest = max(t.stop_timeout for t in config.targets) + 3 * config.recheck.interval + 10
    if not state.wait_idle(longest):
        log.warning("stopping with a job still in progress")
    state.close()
    log.info("webhook stopped")
    return 0
