"""``hangwatch webhook``: the Alertmanager receiver that restarts only what it proves hung.

Alertmanager wants an answer within seconds and retries only a 5xx, so ``POST /alerts`` checks the
token before reading the body, triages each alert cheaply in the request (labels against the config,
one container lookup per target on its own Docker host, under ``DOCKER_DEADLINE``) and hands the slow
part to the per-target worker: 200 handled or ignored, 400 bad payload, 401 bad token, 503 when a
target's Docker host is unreachable. ``create_app`` takes every collaborator (tests and the demo pass
their own); ``main`` alone builds the real ones.
"""
from __future__ import annotations

import hmac
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from hangwatch import __version__, logs
from hangwatch.settings import EXIT_CONFIG, ConfigError, listen_address

from .config import Config, load_config, load_reset_token, load_token
from .decisions import REASONS, SKIP
from .ledger import Ledger, LedgerError
from .lookups import HostLookups
from .metrics import CONTENT_TYPE, WebhookMetrics
from .payload import BadPayload, parse_payload
from .policy import Job, Policy
from .restarter import DOCKER_TIMEOUT, Restarter, docker_restarters
from .server import MAX_BODY_BYTES, serve
from .statedir import StateDirError
from .worker import Worker

log = logging.getLogger("hangwatch.webhook")

DOCKER_DEADLINE = 0.8  # seconds the request may wait for Docker (Alertmanager wants an answer fast)


def restart_bound(config: Config) -> float:
    """How long a restart under way may still take (the capture before it where a target has a
    ``forensics_url``, the log tail, the records, ``docker restart`` with the longest stop timeout):
    SIGTERM waits this long, and no longer, for it."""
    capture = config.forensics_timeout if any(t.forensics_url for t in config.targets) else 0
    return capture + max(t.stop_timeout for t in config.targets) + 3 * DOCKER_TIMEOUT + 5


@dataclass
class WebhookState:
    """What the app holds; tests reach it as ``app.extensions["hangwatch"]``."""
    config: Config
    policy: Policy
    worker: Worker
    ledger: Ledger
    metrics: WebhookMetrics
    lookups: HostLookups
    tokens: tuple[bytes, ...] = ()  # every bearer token some endpoint accepts

    def may_send_body(self, authorization: str) -> bool:
        """May a request with this ``Authorization`` header have its body read? Only with a
        token some endpoint accepts (``server.BodyGate`` asks before buffering a body)."""
        return any(bearer_matches(authorization, token) for token in self.tokens)

    @property
    def restart_bound(self) -> float:
        return restart_bound(self.config)

    def wait_idle(self, timeout: float) -> bool:
        """No job queued or running (recovery watches may still run: ``policy.wait_watches``)."""
        return self.worker.wait_idle(timeout)

    def shutdown(self, timeout: float) -> bool:
        """No new restart; wait up to ``timeout`` s for one under way; close. True if none was cut short."""
        finished = self.policy.stop(timeout)
        if self.worker.in_progress():
            log.info("stopping: abandoning %d job(s) still re-checking (Alertmanager re-sends)",
                     self.worker.in_progress())
        self.close()
        return finished

    def close(self) -> None:
        self.policy.stop_watching()
        self.lookups.close()
        self.ledger.close()


def create_app(config: Config, *, token: str, restarter: Restarter | Mapping[str, Restarter],
               reset_token: str | None = None,
               clock=time.time, rechecker=None, dry_run: bool | None = None, ledger: Ledger | None = None,
               replica: str | None = None, docker_deadline: float = DOCKER_DEADLINE, forensics=None) -> Flask:
    if rechecker is None:
        from hangwatch.check import check as rechecker
    ledger = ledger or Ledger(config.state_dir, keep=config.history)
    holder: dict = {}
    metrics = WebhookMetrics(lambda: holder["policy"].circuit_open(), lambda: holder["worker"].in_progress(),
                             lambda: holder["policy"].group_restarting())
    dry_run = config.dry_run if dry_run is None else dry_run
    metrics.preset([target.name for target in config.targets], REASONS,
                   groups={target.name: target.group for target in config.targets},
                   results=("dry_run",) if dry_run else ("ok", "failed"))
    policy = Policy(config, restarter=restarter, clock=clock, rechecker=rechecker, ledger=ledger, metrics=metrics,
                    dry_run=dry_run, replica=replica, forensics=forensics)
    worker = Worker(policy.run)
    holder.update(policy=policy, worker=worker)
    alert_token = token.encode()
    reset_tokens = [(reset_token or token).encode()]
    state = WebhookState(config, policy, worker, ledger, metrics,
                         HostLookups([host.name for host in config.hosts], policy.container),
                         tokens=(alert_token, *reset_tokens))

    app = Flask("hangwatch.webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["hangwatch"] = state

    def authorized(expected: bytes) -> bool:
        return bearer_matches(request.headers.get("Authorization", ""), expected)

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
        if not authorized(alert_token):  # before the body is read or parsed
            return unauthorized()
        body = request.get_data(cache=False)
        log.debug("payload: %r", body[:4096])
        try:
            parsed = parse_payload(body)
        except BadPayload as exc:
            log.info("rejected payload: %s", exc)
            return jsonify(error=str(exc)), 400
        candidates = [(alert, target) for alert in parsed if (target := policy.triage(alert)) is not None]
        if not candidates:
            return jsonify(alerts=len(parsed), queued=[])
        targets = {target.name: target for _, target in candidates}
        found = state.lookups.find_all(targets.values(), docker_deadline)
        queued, unreachable = [], []
        for alert, target in candidates:
            outcome = found[target.name]
            if isinstance(outcome, str):
                policy.record(alert, target, SKIP, "docker_unreachable", outcome)
                unreachable.append(target.name)
            elif not outcome:
                policy.record(alert, target, SKIP, "container_not_found")
            elif worker.submit(target.name, Job(alert, target)):
                queued.append(target.name)
            else:
                policy.record(alert, target, SKIP, "duplicate", "a job for this target is already in progress")
        if unreachable:  # Alertmanager retries the notification; only these targets' hosts failed
            return jsonify(error="docker host unreachable; retry later", alerts=len(parsed), queued=queued,
                           unreachable=sorted(set(unreachable))), 503
        return jsonify(alerts=len(parsed), queued=queued)

    @app.post("/circuit/<name>/reset")
    def reset(name: str):
        if not any(authorized(expected) for expected in reset_tokens):
            return unauthorized()
        target = config.target(name)
        if target is None:
            return jsonify(error="unknown target"), 404
        try:
            policy.reset_circuit(target)
        except LedgerError as exc:
            log.error("circuit reset target=%s NOT done: %s", target.name, exc)
            return jsonify(error="the ledger cannot be written; the circuit is unchanged"), 503
        return jsonify(target=target.name, reset=True)

    @app.get("/metrics")
    def self_metrics():
        return Response(metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok", dry_run=policy.dry_run, targets=len(config.targets),
                       jobs_in_progress=worker.in_progress())

    return app


def bearer_matches(authorization: str, expected: bytes) -> bool:
    """Is ``authorization`` (an ``Authorization`` header) ``Bearer <expected>``? In constant time."""
    scheme, _, credentials = authorization.partition(" ")
    given = credentials.strip().encode("utf-8", errors="replace")
    return hmac.compare_digest(given, expected) and scheme.lower() == "bearer"


def main(args) -> int:
    try:
        logs.setup(logs.resolve_level(getattr(args, "log_level", None)), getattr(args, "log_format", "text"))
        config = load_config(args.config)
        token = load_token(config)
        reset_token = load_reset_token(config, token)
        host, port = listen_address(args.listen)
        try:
            ledger = Ledger(config.state_dir, keep=config.history)
        except StateDirError as exc:
            raise ConfigError(f"state_dir: {exc}") from None
        except (OSError, LedgerError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise ConfigError(f"state_dir: cannot use {config.state_dir}: {reason}") from None
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch webhook: {exc}\n")
        return EXIT_CONFIG
    dry_run = bool(config.dry_run or args.dry_run)
    app = create_app(config, token=token, reset_token=reset_token, restarter=docker_restarters(config), ledger=ledger,
                     dry_run=dry_run)
    targets = ",".join(t.name for t in config.targets)
    return serve(app, host, port, banner=f"hangwatch {__version__}; targets: {targets}; "
                                         f"dry_run={str(dry_run).lower()}; state_dir={config.state_dir}",
                 install_signals=False, ready=_stop_on_signals)


def _stop_on_signals(server) -> None:
    """SIGTERM or SIGINT stops the server at once, not at its loop's next poll (up to 0.5 s
    later): the handler only starts a thread, which sets the stop flag and wakes the loop (waking
    it from the handler itself could wait on a lock the interrupted loop holds)."""
    def stop(signum, frame):
        threading.Thread(target=server.request_stop, name="hangwatch-stop", daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
