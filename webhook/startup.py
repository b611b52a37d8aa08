"""A start-up that never finishes, on Docker: restarted once, then left to people.

A server loading weights keeps its port closed for minutes, so ``down`` alone is never restarted.
CUDA-graph capture and NCCL init can hang before the port opens, though (vllm#52682), and then
``down`` lasts for ever; Kubernetes has a startup deadline for that, Docker none. A target with a
``startup_deadline`` opts in: on ``HangwatchBackendDown`` the webhook re-checks, and a container
up longer than the deadline whose port is closed (the re-check reads ``down``) and whose log got
no new line during the re-check is ``startup_stuck``. It is restarted once (verdict
``startup_stuck`` in the ledger, every limit applying); stuck again in the process that restart
started, it is ``alert_only`` (class ``startup``: one incident, escalation once), not restarted
again.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from hangwatch.forensics import serverlog
from hangwatch.verdict import Verdict

from .decisions import REASONS, SKIP
from .wrongtool import ALERT_ONLY, Judgement, told_key

DOWN_ALERT = "HangwatchBackendDown"
STUCK = "startup_stuck"


def applies(alert, target) -> bool:
    """Is this a down alert about a target that opted in with ``startup_deadline``?"""
    return alert.label("alertname") == DOWN_ALERT and target.startup_deadline is not None


class Startups:
    def __init__(self, policy):
        self.policy = policy   # the Policy: its re-check, vetoes, lock and restart

    def run(self, alert, target) -> None:
        policy = self.policy
        record = policy.record
        began = policy.clock()
        try:
            result = policy._recheck(alert, target)
        except Exception as exc:
            record(alert, target, SKIP, "recheck_error", f"{type(exc).__name__}: {exc}")
            return
        state = result.verdict.state
        if state != "down":
            reason = f"recheck_{state}" if f"recheck_{state}" in REASONS else "recheck_error"
            record(alert, target, SKIP, reason, result.verdict.reason)
            return
        try:
            container = policy.container(target)
            logs = policy.restarter(target).log_tail(container, 100)
        except Exception as exc:
            record(alert, target, SKIP, "docker_unreachable", f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        why = self._stuck(alert, target, container, logs, began)
        if why is None:
            return
        if self._restarted_once(target, container):
            judgement = Judgement(STUCK, "startup", ALERT_ONLY, None, None)
            if policy.ledger.told(target.name, told_key(container)) is not None:
                record(alert, target, SKIP, ALERT_ONLY, "already told: stuck in start-up again after its restart",
                       **judgement.as_decision())
                return
            incident = {"target": target.name, "container": target.container, "container_id": container.id,
                        "docker_host": target.docker_host.name, "url": target.url, "replica": policy.replica,
                        "container_started_at": container.started_at_text, "signature": STUCK,
                        "recheck": {"verdict": "down", "reason": result.verdict.reason}, "logs": logs,
                        **judgement.as_incident()}
            policy.restarts.alert_only.handle(alert, target, container, incident, judgement,
                                              f"stuck in start-up again after its restart: {why}")
            return
        stuck = dataclasses.replace(result, verdict=Verdict(STUCK, why))
        policy._restart_under_lock(alert, target, stuck, began)

    def _stuck(self, alert, target, container, logs, began: float) -> str | None:
        """Why it is stuck in start-up; None (the skip recorded) while it may still be loading."""
        record = self.policy.record
        now = self.policy.clock()
        started = container.started_at
        if started is None or not container.running:
            record(alert, target, SKIP, "not_running", f"status={container.status}")
            return None
        up = now - started.timestamp()
        if up <= target.startup_deadline:
            record(alert, target, SKIP, "recheck_down",
                               f"up {up:.0f}s, within startup_deadline {target.startup_deadline:g}s: still loading")
            return None
        last = serverlog.last_line_at(logs)
        if last is not None and last.timestamp() >= began:
            record(alert, target, SKIP, "recheck_down",
                   f"up {up:.0f}s, past startup_deadline {target.startup_deadline:g}s, but it still logs "
                   f"(last line {last.isoformat()}): still loading")
            return None
        said = "no log line" if last is None else \
            f"last log line {datetime.fromtimestamp(last.timestamp(), timezone.utc).isoformat()}"
        return (f"up {up:.0f}s, past startup_deadline {target.startup_deadline:g}s, port closed, "
                f"{said} during the re-check")

    def _restarted_once(self, target, container) -> bool:
        """Did our ``startup_stuck`` restart start this very process?"""
        ledger = self.policy.ledger
        last = ledger.last_restart(target.name)
        if last is None or ledger.last_restart_verdict(target.name) != STUCK:
            return False
        started = container.started_at
        return started is not None and started.timestamp() >= last - 1.0

