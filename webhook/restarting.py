"""The restart itself, once every veto has passed: its records first, then the Docker call.

No restart without its records: the incident record (the re-check, the log tail, the stacks) and
the ledger's restart line are written under the fleet lock, where the fleet-wide limits are checked
in the same step, so a crash mid-restart still spends budget and two replicas cannot both pass a
limit; if either record cannot be written there is no restart (``ledger_error``).
"""
from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from typing import Callable, Mapping

from hangwatch.forensics import logsignatures, serverlog

from . import limits
from .config import Config, Target
from .decisions import RESTART, SKIP, Decisions, circuit_detail, iso, iso_ts
from .escalation import Escalations
from .ledger import Ledger, LedgerError
from .metrics import WebhookMetrics
from .payload import Alert
from .recovery import RecoveryWatches
from .restarter import Container, Restarter
from .secrets import forensics_token, scrubbed
from .statedir import fleet_lock, write_incident
from .wrongtool import ALERT_ONLY, AlertOnly, judge

log = logging.getLogger("hangwatch.webhook")

LOG_TAIL_LINES = 100
FLEET_LOCK_DEADLINE = 30.0  # seconds; the fleet lock is held for a ledger read and two writes


class Restarts:
    def __init__(self, config: Config, hosts: dict[str, Restarter], *, forensics: Callable[..., dict],
                 ledger: Ledger, metrics: WebhookMetrics, clock: Callable[[], float], replica: str, dry_run: bool,
                 decisions: Decisions, watches: RecoveryWatches, stopping: Callable[[], bool]):
        self.config = config
        self.hosts = hosts
        self.forensics = forensics
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.replica = replica
        self.dry_run = dry_run
        self.record = decisions.record
        self.watches = watches
        self._stopping = stopping
        self.escalations = Escalations(config, ledger=ledger, metrics=metrics, clock=clock, replica=replica)
        self.alert_only = AlertOnly(config, ledger=ledger, metrics=metrics, record=self.record,
                                    escalations=self.escalations, clock=clock, replica=replica)

    @property
    def stopping(self) -> bool:
        return self._stopping()

    def restarter(self, target: Target) -> Restarter:
        """The restarter of the Docker host the target lives on."""
        return self.hosts[target.docker_host.name]

    def restart(self, alert: Alert, target: Target, container: Container, result) -> None:
        if self.dry_run:
            # Counted per target like a restart, so the dashboard's restart annotation marks
            # what a dry run would have done ("restart of vllm-a: dry_run").
            self.metrics.restarts.labels(target.name, "dry_run").inc()
            self.record(alert, target, RESTART, result.verdict.state, result.verdict.reason, dry_run=True)
            return
        # The log tail, scrubbed of every key the webhook knows: a Docker call, before the fleet lock.
        logs = scrubbed(self._log_tail(target, container), self.config)
        said = logsignatures.match(serverlog.since_start(logs, container.started_at))  # before deciding
        if self.alert_only.already_told(alert, target, container, said):
            return
        stacks = self._capture(target, container)  # once per restart: the vetoes above hold under the target's lock
        incident = {
            "target": target.name, "container": target.container, "container_id": container.id,
            "docker_host": target.docker_host.name, "group": target.group,
            "url": target.url, "module": target.module, "replica": self.replica,
            "alert": {"labels": {k: v[:512] for k, v in list(alert.labels.items())[:64]},
                      "startsAt": iso(alert.starts_at)},
            "container_started_at": container.started_at_text,
            "recheck": _safe(result.as_json),
            "observations": [_safe(o.as_dict) for o in result.observations],
            "logs": logs,
        }
        signed = {}
        if stacks is not None:
            incident |= {"forensics": stacks, "signature": stacks.get("signature")}
            signed = {"signature": stacks.get("signature") or "none"}
        judgement = judge(target, said, stacks.get("signature") if stacks is not None else None)
        incident |= judgement.as_incident()
        if judgement.policy == ALERT_ONLY:
            self.alert_only.handle(alert, target, container, incident, judgement, result.verdict.reason)
            return
        signed |= judgement.as_decision()
        try:
            recorded = self._record_restart(alert, target, incident, result.verdict.state)
        except TimeoutError as exc:
            self.record(alert, target, SKIP, "shutting_down" if self.stopping else "lock_timeout", str(exc))
            return
        if recorded is None:
            return
        now, path = recorded
        self.metrics.note_restart(target.name, signed.get("signature"), now)  # before the restart: scraped sooner
        try:
            self.restarter(target).restart(container, target.stop_timeout)
            outcome, detail = "ok", result.verdict.reason
        except Exception as exc:
            outcome, detail = "failed", f"restart failed: {type(exc).__name__}: {str(exc)[:200]}"
        self.metrics.restarts.labels(target.name, outcome).inc()
        self.record(alert, target, RESTART, result.verdict.state, detail, result=outcome, incident=path, **signed)
        if outcome == "ok" and target.group is not None:
            self.watches.start(target, now)
        counted = self.ledger.restarts_counted(target.name, self.clock(), self.config.budget.window)
        if len(counted) >= self.config.budget.restarts:
            log.error("CIRCUIT OPEN target=%s container=%s %s", target.name, target.container,
                      circuit_detail(self.config.budget, counted))
            self.escalations.escalate(target, key=f"circuit_open:{counted[0]!r}", incident=incident,
                                      incident_path=path, reason="circuit_open")

    def _capture(self, target: Target, container: Container) -> dict | None:
        """The stacks of the container's own processes from the target's forensics place (None: none
        configured), within the deadline."""
        if target.forensics_url is None:
            return None
        try:
            answer = self.forensics(target.forensics_url, target.url, self.config.forensics_timeout,
                                    token=forensics_token(self.config), container=container.id)
        except Exception as exc:  # the restart goes on whatever the capture does
            answer = {"signature": None, "processes": [], "errors": [f"capture failed: {type(exc).__name__}: {exc}"]}
        return scrubbed(answer, self.config)  # the exporter scrubbed too; keys never land here

    def _record_restart(self, alert: Alert, target: Target, incident: dict,
                        verdict: str = "hung") -> tuple[float, str] | None:
        """Under the fleet lock: the fleet-wide limits, then both records (before the Docker call: a
        crash mid-restart still spends budget, starts cooldown and holds the group's slot). Returns
        (when, incident path), or None with the skip recorded. If a record cannot be written there
        is no restart (fail closed)."""
        with fleet_lock(self.config.state_dir, deadline=FLEET_LOCK_DEADLINE, cancelled=lambda: self.stopping):
            try:
                self.ledger.refresh()  # what other targets' jobs and replicas recorded meanwhile
            except LedgerError as exc:
                return self.record(alert, target, SKIP, "ledger_error", str(exc))
            now = self.clock()
            limited = limits.withheld(self.config, self.ledger, target, now)
            if limited is None:
                stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
                incident["decided_at"] = iso_ts(now)
                try:
                    path = write_incident(self.config.state_dir, f"{stamp}-{target.name}-{os.getpid()}", incident)
                    self.ledger.append({"event": "restart", "at": now, "target": target.name,
                                        "container": target.container, "docker_host": target.docker_host.name,
                                        "group": target.group, "replica": self.replica, "incident": path,
                                        "verdict": verdict})
                except LedgerError as exc:
                    return self.record(alert, target, SKIP, "ledger_error", f"no restart without its record: {exc}")
                return now, path
        reason, detail = limited
        self.metrics.withheld.labels(target.name, target.group or "", limits.LIMIT_LABELS[reason]).inc()
        return self.record(alert, target, SKIP, reason, detail)

    def _log_tail(self, target: Target, container: Container) -> list[str]:
        try:
            return self.restarter(target).log_tail(container, LOG_TAIL_LINES)[-LOG_TAIL_LINES:]
        except Exception as exc:
            return [f"(logs unavailable: {type(exc).__name__}: {str(exc)[:200]})"]


def restarters_by_host(config: Config, restarter: Restarter | Mapping[str, Restarter]) -> dict[str, Restarter]:
    """Host name -> restarter for every host a target lives on. One restarter (tests, the demo)
    serves them all; a mapping must name each one (a target without one is a bug)."""
    names = [host.name for host in config.hosts]
    if not isinstance(restarter, Mapping):
        return {name: restarter for name in names}
    missing = [name for name in names if name not in restarter]
    if missing:
        raise ValueError(f"no restarter for docker host(s) {', '.join(missing)}")
    return dict(restarter)


def _safe(call):
    try:
        return call()
    except Exception as exc:  # an incident record must be written even if a reading is odd
        return {"error": f"{type(exc).__name__}: {exc}"}


