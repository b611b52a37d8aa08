"""One decision about an alert: one log line, one counter and, unless ignored, one ledger line.

People and the dashboard learn why hangwatch did or did not restart from these three alone, so every
outcome has one fixed ``reason`` (``REASONS``, the label of ``decisions_total``) and every line reads
the same way; an untrusted label is shown bounded and quoted (``show``), never as it came.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Callable

from .config import Budget, Target
from .ledger import Ledger, LedgerError
from .metrics import WebhookMetrics
from .payload import Alert

log = logging.getLogger("hangwatch.webhook")

RESTART, SKIP = "restart", "skip"
MAX_SHOWN = 120         # characters of an untrusted label value in a log line

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
    "docker_unreachable",       # Docker failed while the job ran (Alertmanager re-sends)
    "duplicate",                # a job for this target is already queued or running
    "not_running",              # the container is restarting, stopped or paused
    "already_restarted",        # started after the alert began (re-send, another replica)
    "cooldown",                 # restarted less than `cooldown` ago
    "circuit_open",             # the restart budget is spent
    "group_limit",              # hung, but group_limit targets of its group are restarting (limits.py)
    "fleet_limit",              # hung, but fleet_budget restarts across the fleet are spent (limits.py)
    "stalled",                  # restart: the re-check proved a stall, and the target opts in (restart_on)
    "not_opted_in",             # a stall alert for a target whose restart_on has no stalled
    "stall_not_healed",         # restarted for a stall, stalled or hung again within the cooldown: circuit opened
    "recheck_idle", "recheck_busy", "recheck_restarted", "recheck_blind", "recheck_down", "recheck_stalled",
    "recheck_hung",
    "recheck_error",            # the re-check itself failed
    "lock_timeout",             # another replica held the target's lock too long
    "ledger_error",             # the ledger or incident record could not be read or written: no restart
    "shutting_down",            # the webhook is stopping: no new restart begins
    "internal_error",
    "alert_only",               # hung, but the signature's class says a restart cannot help (wrongtool.py)
    "startup_stuck",            # restart: up past startup_deadline, port closed, log silent (startup.py)
)
# Logged and counted, never written to the ledger: not an alert this webhook may act on. Alertmanager
# sends them at every group interval; a ledger line each would tell no one more than the counter.
IGNORED = frozenset({"resolved", "alertname_ignored", "unknown_target", "container_label_missing",
                     "container_mismatch"})


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


class Decisions:
    """Records decisions for one webhook (its ledger, counters, clock and replica name)."""

    def __init__(self, *, ledger: Ledger, metrics: WebhookMetrics, clock: Callable[[], float], replica: str,
                 dry_run: bool):
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.replica = replica
        self.dry_run = dry_run

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
        if target is not None:
            fields.append(("docker_host", target.docker_host.name))
        if detail:
            fields.append(("detail", detail))
        line = " ".join(f"{key}={show(value)}" for key, value in fields)
        level = logging.ERROR if reason in ("circuit_open", "ledger_error", "group_limit", "fleet_limit", "alert_only") \
            else logging.INFO
        log.log(level, "%s", line)
        if alert is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("alert labels=%s", show(json.dumps(labels, sort_keys=True)[:2000]))
        self.metrics.decisions.labels(action, reason).inc()
        if reason in IGNORED:
            return None
        try:
            self.ledger.append({
                "event": "decision", "at": self.clock(), "replica": self.replica,
                "alertname": cut(alertname), "target": cut(target_name), "container": cut(container),
                "action": action, "reason": reason, "dry_run": action == RESTART and self.dry_run,
                "docker_host": target.docker_host.name if target else None,
                "detail": cut(detail, 500), **{k: cut(v) for k, v in extra.items() if k != "dry_run"}})
        except LedgerError as exc:
            log.error("ledger: the decision above is not recorded: %s", exc)
        return None


def circuit_detail(budget: Budget, counted: list[float]) -> str:
    closes = min(counted) + budget.window
    return (f"{len(counted)} restarts within {budget.window:g}s (budget {budget.restarts}); no restarts "
            f"until {iso_ts(closes)} or POST /circuit/<target>/reset")


def cut(value, limit: int = 200):
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    return value


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def iso_ts(seconds: float) -> str:
    return iso(datetime.fromtimestamp(seconds, timezone.utc))
