"""Decide, for one alert about one configured target, whether to restart — and do it once.

The alert is only a hint. A restart needs all of: the alert began no later than now (plus a
small clock skew); the container exists, runs, and has not been (re)started since the alert
began; the target is out of its cooldown and inside its restart budget; and the webhook's
*own* re-check of the backend (the verdict core in ``hangwatch.check``) says ``hung``. The
final checks and the restart run under a file lock per target, after re-reading the ledger,
so two replicas sharing a state_dir and a Docker engine restart once. No restart without its
records: the incident record and the ledger's restart line are written first, and if either
cannot be written the answer is no (``ledger_error``).

Every outcome is one log line and one counter; every decision about a configured target is
also one ledger line. Alerts that are not ours to act on (resolved, another alertname, an
unknown target, a container label that does not match) are only logged and counted: Alertmanager
sends them at every group interval, and a ledger line each would grow it without telling anyone
anything the counter does not.

The container engine is behind ``restarter.Restarter``; this module never imports Docker.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from .config import Config, Target
from .ledger import Ledger, LedgerError, target_lock, write_incident
from .metrics import WebhookMetrics
from .payload import Alert
from .restarter import Container, ContainerNotFound, EngineError, Restarter

log = logging.getLogger("hangwatch.webhook")

RESTART, SKIP = "restart", "skip"
LOG_TAIL_LINES = 100
MAX_SHOWN = 120         # characters of an untrusted label value in a log line
MAX_CLOCK_SKEW = 30.0   # seconds an alert's startsAt may lie ahead of our clock
STOPPING = "re-check said hung while the webhook was stopping"

# Every reason a decision can give (the `reason` label of decisions_total; a fixed set).
REASONS = (
    "hung",                     # restart: the re-check proved the hang
    "resolved",                 # the alert is not firing
    "alertname_ignored",        # not one of config.alertnames
    "unknown_target",           # the `target` label is not a configured target
    "container_label_missing",  # no `container` label: never restarted (DESIGN.md)
    "container_mismatch",       # the `container` label is not the configured container
    "starts_in_future",         # startsAt later than now + MAX_CLOCK_SKEW: a clock or a sender is wrong
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
    "ledger_error",             # the ledger or incident record could not be read or written: no restart
    "shutting_down",            # the webhook is stopping: no new restart begins
    "internal_error",
)
# Logged and counted, never written to the ledger: not an alert this webhook may act on.
IGNORED = frozenset({"resolved", "alertname_ignored", "unknown_target", "container_label_missing",
                     "container_mismatch"})


@dataclass(frozen=True)
class Job:
    alert: Alert
    target: Target


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


class Policy:
    def __init__(self, config: Config, *, restarter: Restarter, clock: Callable[[], float], rechecker,
                 ledger: Ledger, metrics: WebhookMetrics, dry_run: bool, replica: str | None = None):
        self.config = config
        self.restarter = restarter
        self.clock = clock
        self.rechecker = rechecker
        self.ledger = ledger
        self.metrics = metrics
        self.dry_run = dry_run
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}"
        self._phase = threading.Condition()
        self._stopping = False
        self._restarting = 0  # jobs past the point of no return (records written, restart under way)

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
        now = self.clock()
        if alert.starts_at is not None and alert.starts_at.timestamp() > now + MAX_CLOCK_SKEW:
            return self.record(alert, target, SKIP, "starts_in_future",
                               f"startsAt {_iso(alert.starts_at)} is {alert.starts_at.timestamp() - now:.0f}s "
                               f"ahead of this host's clock (more than {MAX_CLOCK_SKEW:g}s)")
        return target

    def container(self, target: Target) -> Container:
        """The configured container (ContainerNotFound, EngineError)."""
        return self.restarter.find(target.container)

    # -- the slow part, in the worker ---------------------------------------------------
    def run(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception as exc:  # a bug must still leave one line and never restart twice
            log.exception("unexpected error deciding for target %s", job.target.name)
            self.record(job.alert, job.target, SKIP, "internal_error", type(exc).__name__)

    def _run(self, job: Job) -> None:
        alert, target = job.alert, job.target
        if self._vetoed(alert, target, since=None, refresh=True) is None:
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
        if self.stopping:
            self.record(alert, target, SKIP, "shutting_down", STOPPING)
            return
        deadline = target.stop_timeout + 2 * self.config.recheck.timeout + 60
        try:
            with target_lock(self.config.state_dir, target.name, deadline=deadline, cancelled=lambda: self.stopping):
                container = self._vetoed(alert, target, since=recheck_started, refresh=True)
                if container is None:
                    return
                if not self._begin_restart():
                    self.record(alert, target, SKIP, "shutting_down", STOPPING)
                    return
                try:
                    self._restart(alert, target, container, result)
                finally:
                    self._end_restart()
        except TimeoutError as exc:
            reason = "shutting_down" if self.stopping else "lock_timeout"
            self.record(alert, target, SKIP, reason, str(exc))

    def _vetoed(self, alert: Alert, target: Target, since: float | None, refresh: bool = False) -> Container | None:
        """The container if nothing forbids a restart; else None, with the skip recorded."""
        if refresh:
            try:
                self.ledger.refresh()  # what another replica did while we re-checked
            except LedgerError as exc:
                return self.record(alert, target, SKIP, "ledger_error", str(exc))
        try:
            container = self.container(target)
        except ContainerNotFound:
            return self.record(alert, target, SKIP, "container_not_found")
        except EngineError as exc:
            return self.record(alert, target, SKIP, "docker_unreachable", str(exc))
        if container.restarting or not container.running or container.paused:
            return self.record(alert, target, SKIP, "not_running", f"status={container.status}")
        started = container.started_at
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

    def _restart(self, alert: Alert, target: Target, container: Container, result) -> None:
        if self.dry_run:
            self.record(alert, target, RESTART, "hung", result.verdict.reason, dry_run=True)
            return
        now = self.clock()
        stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        incident = {
            "target": target.name, "container": target.container, "container_id": container.id,
            "url": target.url, "module": target.module, "replica": self.replica, "decided_at": _iso_ts(now),
            "alert": {"labels": {k: v[:512] for k, v in list(alert.labels.items())[:64]},
                      "startsAt": _iso(alert.starts_at)},
            "container_started_at": container.started_at_text,
            "recheck": _safe(result.as_json),
            "observations": [_safe(o.as_dict) for o in result.observations],
            "logs": self._log_tail(container),
        }
        # Both records before the call: a crash mid-restart still spends budget and starts
        # cooldown. If either cannot be written, there is no restart (fail closed).
        try:
            path = write_incident(self.config.state_dir, f"{stamp}-{target.name}-{os.getpid()}", incident)
            self.ledger.append({"event": "restart", "at": now, "target": target.name,
                                "container": target.container, "replica": self.replica, "incident": path})
        except LedgerError as exc:
            self.record(alert, target, SKIP, "ledger_error", f"no restart without its record: {exc}")
            return
        try:
            self.restarter.restart(container, target.stop_timeout)
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

    def _log_tail(self, container: Container) -> list[str]:
        try:
            return self.restarter.log_tail(container, LOG_TAIL_LINES)[-LOG_TAIL_LINES:]
        except Exception as exc:
            return [f"(logs unavailable: {type(exc).__name__}: {str(exc)[:200]})"]

    # -- stopping -----------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping

    def _begin_restart(self) -> bool:
        with self._phase:
            if self._stopping:
                return False
            self._restarting += 1
            return True

    def _end_restart(self) -> None:
        with self._phase:
            self._restarting -= 1
            self._phase.notify_all()

    def stop(self, timeout: float) -> bool:
        """No restart begins from now on; wait up to ``timeout`` s for those under way.
        True if none is left. Jobs still re-checking are abandoned (Alertmanager re-sends)."""
        deadline = time.monotonic() + timeout
        with self._phase:
            self._stopping = True
            while self._restarting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._phase.wait(left)
        return True

    # -- bookkeeping --------------------------------------------------------------------
    def record(self, alert: Alert | None, target: Target | None, action: str, reason: str,
               detail: str = "", **extra) -> None:
        """One decision: one log line, one counter and, unless ignored, one ledger line.
        Returns None (for chaining)."""
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
        level = logging.ERROR if reason in ("circuit_open", "ledger_error") else logging.INFO
        log.log(level, "%s", line)
        if alert is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("alert labels=%s", show(json.dumps(labels, sort_keys=True)[:2000]))
        self.metrics.decisions.labels(action, reason).inc()
        if reason in IGNORED:
            return None
        try:
            self.ledger.append({
                "event": "decision", "at": self.clock(), "replica": self.replica,
                "alertname": _cut(alertname), "target": _cut(target_name), "container": _cut(container),
                "action": action, "reason": reason, "dry_run": action == RESTART and self.dry_run,
                "detail": _cut(detail, 500), **{k: _cut(v) for k, v in extra.items() if k != "dry_run"}})
        except LedgerError as exc:
            log.error("ledger: the decision above is not recorded: %s", exc)
        return None

    def circuit_open(self) -> dict[str, bool]:
        try:
            self.ledger.refresh()
        except LedgerError as exc:  # the last state read stays the answer
            log.error("%s", exc)
        now = self.clock()
        budget = self.config.budget
        return {t.name: len(self.ledger.restarts_counted(t.name, now, budget.window)) >= budget.restarts
                for t in self.config.targets}

    def reset_circuit(self, target: Target) -> None:
        """Close the target's circuit; LedgerError if the reset could not be recorded (then it did not happen)."""
        at = self.clock()
        self.ledger.append({"event": "circuit_reset", "at": at, "target": target.name, "replica": self.replica})
        if self.ledger.reset_at(target.name) < at:
            raise LedgerError("the reset was written but does not read back")
        log.warning("circuit reset target=%s container=%s by operator request", target.name, target.container)


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
