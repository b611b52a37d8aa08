"""Decide, for one alert about one configured target, whether to restart — and do it once.

The alert is only a hint. A restart needs all of: the container exists, runs, and has not
been (re)started since the alert began; the target is out of its cooldown and inside its
restart budget; and the webhook's *own* re-check of the backend (the verdict core in
``hangwatch.check``) says ``hung``. The final checks and the restart run under a file lock
per target, after re-reading the ledger, so two replicas sharing a state_dir and a Docker
engine restart once. Every outcome is one log line, one ledger line, one counter.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from docker.errors import NotFound

from .config import Config, Target
from .ledger import Ledger, target_lock, write_incident
from .metrics import WebhookMetrics
from .payload import Alert, parse_rfc3339

log = logging.getLogger("hangwatch.webhook")

RESTART, SKIP = "restart", "skip"
LOG_TAIL_LINES = 100
MAX_SHOWN = 120  # characters of an untrusted label value in a log line

# Every reason a decision can give (the `reason` label of decisions_total; a fixed set).
REASONS = (
    "hung",                     # restart: the re-check proved the hang
    "resolved",                 # the alert is not firing
    "alertname_ignored",        # not one of config.alertnames
    "unknown_target",           # the `target` label is not a configured target
    "container_label_missing",  # no `container` label: never restarted (DESIGN.md)
    "container_mismatch",       # the `container` label is not the configured container
    "container_not_found",      # Docker has no such container
    "docker_unreachable",       # the engine failed while the job ran (Alertmanager re-sends)
    "duplicate",                # a job for this target is already queued or running
    "not_running",              # the container is restarting, stopped or paused
    "already_restarted",        # started after the alert began (re-send, another replica)
    "cooldown",                 # restarted less than `cooldown` ago
    "circuit_open",             # the restart budget is spent
    "recheck_idle", "recheck_busy", "recheck_restarted", "recheck_blind", "recheck_down",
    "recheck_error",            # the re-check itself failed
    "lock_timeout",             # another replica held the target's lock too long
    "internal_error",
)


@dataclass(frozen=True)
class Job:
    alert: Alert
    target: Target


class EngineError(Exception):
    """The Docker engine did not answer usefully (unreachable, timed out, 5xx)."""


def show(value) -> str:
    """A log-safe rendering of an untrusted value: one line, bounded, quoted when needed."""
    if value is None:
        return "-"
    text = str(value)
    if len(text) > MAX_SHOWN:
        text = text[:MAX_SHOWN] + "…"
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return json.dumps(text)


class Decider:
    def __init__(self, config: Config, *, docker_client, clock: Callable[[], float], rechecker,
                 ledger: Ledger, metrics: WebhookMetrics, dry_run: bool, replica: str | None = None):
        self.config = config
        self.docker = docker_client
        self.clock = clock
        self.rechecker = rechecker
        self.ledger = ledger
        self.metrics = metrics
        self.dry_run = dry_run
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}"

    # -- the cheap part, in the request -------------------------------------------------
    def triage(self, alert: Alert) -> Target | None:
        """The configured target this alert may act on, or None (the skip is recorded)."""
        name = alert.label("alertname")
        if not alert.firing:
            return self.record(alert, None, SKIP, "resolved")
        if name not in self.config.alertnames:
            return self.record(alert, None, SKIP, "alertname_ignored")
        target = self.config.target(alert.label("target") or "")
        if target is None:
            return self.record(alert, None, SKIP, "unknown_target")
        label = alert.label("container")
        if label is None:
            return self.record(alert, target, SKIP, "container_label_missing")
        if label != target.container:
            return self.record(alert, target, SKIP, "container_mismatch",
                               f"label container={show(label)}, configured {target.container}")
        return target

    def container(self, target: Target):
        """The configured container (NotFound if Docker has none); EngineError if Docker fails."""
        try:
            return self.docker.containers.get(target.container)
        except NotFound:
            raise
        except Exception as exc:  # ConnectionError, APIError 5xx, timeouts: retry can help
            raise EngineError(f"{type(exc).__name__}: {str(exc)[:200]}") from exc

    # -- the slow part, in the worker ---------------------------------------------------
    def run(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception as exc:  # a bug must still leave one line and never restart twice
            log.exception("unexpected error deciding for target %s", job.target.name)
            self.record(job.alert, job.target, SKIP, "internal_error", type(exc).__name__)

    def _run(self, job: Job) -> None:
        alert, target = job.alert, job.target
        if self._vetoed(alert, target, since=None) is None:
            return
        recheck_started = self.clock()
        try:
            result = self.rechecker(target.url, module=target.module, interval=self.config.recheck.interval,
                                    timeout=self.config.recheck.timeout, api_key=target.api_key,
                                    probe=target.probe)
            state, why = result.verdict.state, result.verdict.reason
        except Exception as exc:
            self.record(alert, target, SKIP, "recheck_error", f"{type(exc).__name__}: {exc}")
            return
        if state != "hung":
            reason = f"recheck_{state}" if f"recheck_{state}" in REASONS else "recheck_error"
            self.record(alert, target, SKIP, reason, why)
            return
        deadline = target.stop_timeout + 2 * self.config.recheck.timeout + 60
        try:
            with target_lock(self.config.state_dir, target.name, deadline=deadline):
                self.ledger.refresh()  # what another replica did while we re-checked
                container = self._vetoed(alert, target, since=recheck_started)
                if container is not None:
                    self._restart(alert, target, container, result)
        except TimeoutError as exc:
            self.record(alert, target, SKIP, "lock_timeout", str(exc))

    def _vetoed(self, alert: Alert, target: Target, since: float | None):
        """The container if nothing forbids a restart; else None, with the skip recorded."""
        try:
            container = self.container(target)
        except NotFound:
            return self.record(alert, target, SKIP, "container_not_found")
        except EngineError as exc:
            return self.record(alert, target, SKIP, "docker_unreachable", str(exc))
        state = container.attrs.get("State") or {}
        if state.get("Restarting") or not state.get("Running") or state.get("Paused"):
            return self.record(alert, target, SKIP, "not_running", f"status={state.get('Status')}")
        started = _started_at(state)
        if started is not None:
            if alert.starts_at is not None and started > alert.starts_at:
                return self.record(alert, target, SKIP, "already_restarted",
                                   f"container started {_iso(started)}, after the alert began {_iso(alert.starts_at)}")
            if since is not None and started.timestamp() > since:
                return self.record(alert, target, SKIP, "already_restarted",
                                   f"container started {_iso(started)}, during the re-check")
        now = self.clock()
        last = self.ledger.last_restart(target.name)
        if last is not None and now - last < self.config.cooldown:
            return self.record(alert, target, SKIP, "cooldown",
                               f"restarted {now - last:.0f}s ago; cooldown {self.config.cooldown:g}s")
        counted = self.ledger.restarts_counted(target.name, now, self.config.budget.window)
        if len(counted) >= self.config.budget.restarts:
            return self.record(alert, target, SKIP, "circuit_open", self._circuit_detail(counted))
        return container

    def _restart(self, alert: Alert, target: Target, container, result) -> None:
        if self.dry_run:
            self.record(alert, target, RESTART, "hung", result.verdict.reason, dry_run=True)
            return
        now = self.clock()
        stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        state = container.attrs.get("State") or {}
        incident = {
            "target": target.name, "container": target.container, "container_id": container.id,
            "url": target.url, "module": target.module, "replica": self.replica, "decided_at": _iso_ts(now),
            "alert": {"labels": {k: v[:512] for k, v in list(alert.labels.items())[:64]},
                      "startsAt": _iso(alert.starts_at)},
            "container_started_at": state.get("StartedAt"),
            "recheck": _safe(result.as_json),
            "observations": [_safe(o.as_dict) for o in result.observations],
            "logs": self._log_tail(container),
        }
        path = write_incident(self.config.state_dir, f"{stamp}-{target.name}-{os.getpid()}", incident)
        # Counted before the call: a crash mid-restart still spends budget and starts cooldown.
        self.ledger.append({"event": "restart", "at": now, "target": target.name,
                            "container": target.container, "replica": self.replica, "incident": path})
        try:
            container.restart(timeout=int(math.ceil(target.stop_timeout)))
            outcome, detail = "ok", result.verdict.reason
        except Exception as exc:
            outcome, detail = "failed", f"restart failed: {type(exc).__name__}: {str(exc)[:200]}"
        self.metrics.restarts.labels(target.name, outcome).inc()
        self.record(alert, target, RESTART, "hung", detail, result=outcome, incident=path)
        counted = self.ledger.restarts_counted(target.name, self.clock(), self.config.budget.window)
        if len(counted) >= self.config.budget.restarts:
            log.error("CIRCUIT OPEN target=%s container=%s %s", target.name, target.container,
                      self._circuit_detail(counted))

    def _circuit_detail(self, counted: list[float]) -> str:
        budget = self.config.budget
        closes = min(counted) + budget.window
        return (f"{len(counted)} restarts within {budget.window:g}s (budget {budget.restarts}); no restarts "
                f"until {_iso_ts(closes)} or POST /circuit/<target>/reset")

    def _log_tail(self, container) -> list[str]:
        try:
            raw = container.logs(tail=LOG_TAIL_LINES, timestamps=True)
        except Exception as exc:
            return [f"(logs unavailable: {type(exc).__name__}: {str(exc)[:200]})"]
        return raw.decode("utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]

    # -- bookkeeping --------------------------------------------------------------------
    def record(self, alert: Alert | None, target: Target | None, action: str, reason: str,
               detail: str = "", **extra) -> None:
        """One decision: one log line, one ledger line, one counter. Returns None (for chaining)."""
        labels = alert.labels if alert else {}
        alertname = labels.get("alertname")
        target_name = target.name if target else labels.get("target")
        container = target.container if target else labels.get("container")
        fields = [("alertname", alertname), ("target", target_name), ("container", container),
                  ("action", action), ("reason", reason)]
        if action == RESTART and self.dry_run:
            fields.append(("dry_run", "true"))
        fields += [(k, v) for k, v in extra.items() if k != "dry_run"]
        if detail:
            fields.append(("detail", detail))
        line = " ".join(f"{key}={show(value)}" for key, value in fields)
        log.log(logging.ERROR if reason == "circuit_open" else logging.INFO, "%s", line)
        if alert is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("alert labels=%s", show(json.dumps(labels, sort_keys=True)[:2000]))
        self.metrics.decisions.labels(action, reason).inc()
        self.ledger.append({
            "event": "decision", "at": self.clock(), "replica": self.replica,
            "alertname": _cut(alertname), "target": _cut(target_name), "container": _cut(container),
            "action": action, "reason": reason, "dry_run": action == RESTART and self.dry_run,
            "detail": _cut(detail, 500), **{k: _cut(v) for k, v in extra.items() if k != "dry_run"}})
        return None

    def circuit_open(self) -> dict[str, bool]:
        self.ledger.refresh()
        now = self.clock()
        budget = self.config.budget
        return {t.name: len(self.ledger.restarts_counted(t.name, now, budget.window)) >= budget.restarts
                for t in self.config.targets}

    def reset_circuit(self, target: Target) -> None:
        self.ledger.append({"event": "circuit_reset", "at": self.clock(), "target": target.name,
                            "replica": self.replica})
        log.warning("circuit reset target=%s container=%s by operator request", target.name, target.container)


def _started_at(state: dict) -> datetime | None:
    text = state.get("StartedAt")
    if not isinstance(text, str):
        return None
    try:
        started = parse_rfc3339(text)
    except ValueError:
        return None
    return None if started.year < 2000 else started  # "0001-01-01T00:00:00Z": never started


def _safe(call):
    try:
        return call()
    except Exception as exc:  # an incident record must be written even if a reading is odd
        return {"error": f"{type(exc).__name__}: {exc}"}


def _cut(value, limit: int = 200):
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    return value


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def _iso_ts(seconds: float) -> str:
    return _iso(datetime.fromtimestamp(seconds, timezone.utc))
