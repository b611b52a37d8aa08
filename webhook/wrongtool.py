"""Is a restart the right tool? The server's log and its stacks → a class → restart or alert only.

The re-check proves a hang; it does not say whether a restart can heal it. Before anything is
recorded, the webhook reads the server's log since its container started and matches it against
the catalogue (``hangwatch.forensics.logsignatures``), takes the stack signature of the capture
when there is one, and ``judge`` combines them: the log row's class wins, else the stack
signature's (a name the stack table does not know: ``invalid``). The target's ``policy`` may
override the default per class. ``alert_only`` means no restart: one incident record and one
``alert_only`` ledger line per hung process (re-sent alerts are only counted), the decision with
the matched line, ``hangwatch_webhook_alert_only_total{target,class}`` (HangwatchWebhookAlertOnly
tells people why), and the escalation (``escalation.py``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone

from hangwatch.forensics import logsignatures
from hangwatch.forensics.logsignatures import LogMatch

from .statedir import write_incident

log = logging.getLogger("hangwatch.webhook")

RESTART, ALERT_ONLY = "restart", "alert_only"


@dataclass(frozen=True)
class Judgement:
    signature: str | None        # the log signature when a line matched, else the stack signature
    klass: str
    policy: str
    log_match: LogMatch | None
    stack_signature: str | None

    def as_incident(self) -> dict:
        return {"class": self.klass, "policy": self.policy,
                "log_signature": self.log_match.as_dict() if self.log_match else None}

    def as_decision(self) -> dict:
        extra = {"class": self.klass, "policy": self.policy}
        if self.log_match is not None:
            extra |= {"log_signature": self.log_match.name, "line": self.log_match.line[:300]}
        return extra


def policy_for(target, klass: str, default: str) -> str:
    return dict(target.policy or ()).get(klass, default)


def judge(target, log_match: LogMatch | None, stack_signature: str | None) -> Judgement:
    """The log row's class and policy when a line matched; else the stack signature's class,
    restarted as before logs were read. The target's ``policy`` overrides either."""
    if log_match is not None:
        return Judgement(log_match.name, log_match.klass, policy_for(target, log_match.klass, log_match.policy),
                         log_match, stack_signature)
    klass = logsignatures.stack_class(stack_signature)
    return Judgement(stack_signature, klass, policy_for(target, klass, RESTART), None, stack_signature)


def told_key(container) -> str:
    """One incident per hung process: the container and when it started."""
    return f"{container.id}@{container.started_at_text}"


class AlertOnly:
    """The hang a restart cannot heal: told once per process, escalated once, never restarted."""

    def __init__(self, config, *, ledger, metrics, record, escalations, clock, replica: str):
        self.config = config
        self.ledger = ledger
        self.metrics = metrics
        self.record = record
        self.escalations = escalations
        self.clock = clock
        self.replica = replica

    def already_told(self, alert, target, container, log_match: LogMatch | None) -> bool:
        """A re-sent alert about a process already told about: the decision only (no capture,
        no incident, no escalation). True when so."""
        if log_match is None or policy_for(target, log_match.klass, log_match.policy) != ALERT_ONLY:
            return False
        told = self.ledger.told(target.name, told_key(container))
        if told is None:
            return False
        self.record(alert, target, "skip", ALERT_ONLY, f"already told: incident {os.path.basename(told)}",
                    **{"class": log_match.klass, "policy": ALERT_ONLY, "log_signature": log_match.name})
        return True

    def handle(self, alert, target, container, incident: dict, judgement: Judgement, why: str) -> None:
        from .decisions import iso_ts  # here: config.py imports this module, decisions.py imports config.py
        now = self.clock()
        key = told_key(container)
        stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        incident |= {"decided_at": iso_ts(now), "action": ALERT_ONLY}
        try:
            path = write_incident(self.config.state_dir, f"{stamp}-{target.name}-{os.getpid()}", incident)
            self.ledger.append({"event": ALERT_ONLY, "at": now, "target": target.name, "key": key,
                                "incident": path, "class": judgement.klass, "signature": judgement.signature,
                                "replica": self.replica})
        except Exception as exc:  # LedgerError: no record, but still no restart (it cannot help)
            self.record(alert, target, "skip", "ledger_error", f"alert only, and not recorded: {exc}")
            return
        self.metrics.alert_only.labels(target.name, judgement.klass).inc()
        detail = f"{judgement.klass}: {why}"
        stack = {"signature": judgement.stack_signature} if judgement.stack_signature else {}
        self.record(alert, target, "skip", ALERT_ONLY, detail, incident=path, **stack, **judgement.as_decision())
        log.error("ALERT ONLY target=%s container=%s class=%s signature=%s: a restart cannot help; "
                  "incident %s", target.name, target.container, judgement.klass, judgement.signature, path)
        self.escalations.escalate(target, key=f"alert_only:{key}", incident=incident, incident_path=path,
                                  reason=ALERT_ONLY)
