"""Decide, for one alert about one configured target, whether to restart — and do it once.

The alert is only a hint: a restart needs the webhook's own re-check (the verdict core in
``hangwatch.check``) to say ``hung`` (or ``stalled``, where the target opts in), a container that runs
and has not been restarted since the alert began, and every limit — cooldown, budget, circuit, the
fleet-wide ones — to leave room. The final vetoes and the restart run under a file lock per target,
after re-reading the ledger, so replicas sharing a state_dir restart once. Docker stays behind
``restarter.Restarter``; the act is ``restarting.py``'s, the records ``decisions.py``'s.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from . import limits
from .config import STALL_ALERT, Config, Target
from .decisions import REASONS, SKIP, Decisions, circuit_detail, iso, iso_ts, show
from .forensics import ask as ask_forensics
from .ledger import Ledger, LedgerError
from .metrics import WebhookMetrics
from .payload import Alert
from .recovery import RecoveryWatches
from .restarter import Container, ContainerNotFound, DockerError, Restarter
from .restarting import Restarts, restarters_by_host
from .startup import DOWN_ALERT, Startups
from .startup import applies as startup_applies
from .statedir import target_lock

log = logging.getLogger("hangwatch.webhook")

MAX_CLOCK_SKEW = 30.0   # seconds an alert's startsAt may lie ahead of our clock
STOPPING = "re-check said hung while the webhook was stopping"


@dataclass(frozen=True)
class Job:
    alert: Alert
    target: Target


class Policy:
    def __init__(self, config: Config, *, restarter: Restarter | Mapping[str, Restarter], clock: Callable[[], float],
                 rechecker, ledger: Ledger, metrics: WebhookMetrics, dry_run: bool, replica: str | None = None,
                 forensics: Callable[..., dict] | None = None):
        self.config = config
        self.hosts = restarters_by_host(config, restarter)
        self.clock = clock
        self.rechecker = rechecker
        self.ledger = ledger
        self.metrics = metrics
        self.dry_run = dry_run
        self.replica = replica or f"{socket.gethostname()}-{os.getpid()}"
        self._phase = threading.Condition()
        self._stopping = False
        self._restarting = 0  # jobs past the point of no return (records written, restart under way)
        self.decisions = Decisions(ledger=ledger, metrics=metrics, clock=clock, replica=self.replica, dry_run=dry_run)
        self.watches = RecoveryWatches(config, rechecker=rechecker, ledger=ledger, clock=clock, replica=self.replica)
        self.restarts = Restarts(config, self.hosts, forensics=forensics or ask_forensics, ledger=ledger,
                                 metrics=metrics, clock=clock, replica=self.replica, dry_run=dry_run,
                                 decisions=self.decisions, watches=self.watches, stopping=lambda: self.stopping)
        self.startups = Startups(self)

    # -- the cheap part, in the request -------------------------------------------------
    def triage(self, alert: Alert) -> Target | None:
        """The configured target this alert may act on, or None (the skip is recorded)."""
        name = alert.label("alertname")
        if not alert.firing:
            return self.record(alert, None, SKIP, "resolved")
        target = self.config.target(alert.label("target") or "")
        if name == DOWN_ALERT and name not in self.config.alertnames and (
                target is None or target.startup_deadline is None):
            return self.record(alert, None, SKIP, "alertname_ignored")  # only where startup_deadline opts in
        if name not in self.config.alertnames and name not in (STALL_ALERT, DOWN_ALERT):
            return self.record(alert, None, SKIP, "alertname_ignored")
        if target is None:
            return self.record(alert, None, SKIP, "unknown_target")
        if name == STALL_ALERT and "stalled" not in target.restart_on:
            return self.record(alert, target, SKIP, "not_opted_in",
                               "a stall is restarted only where restart_on has stalled")
        label = alert.label("container")
        if label is None:
            return self.record(alert, target, SKIP, "container_label_missing")
        if label != target.container:
            return self.record(alert, target, SKIP, "container_mismatch",
                               f"label container={show(label)}, configured {target.container}")
        now = self.clock()
        if alert.starts_at is not None and alert.starts_at.timestamp() > now + MAX_CLOCK_SKEW:
            return self.record(alert, target, SKIP, "starts_in_future",
                               f"startsAt {iso(alert.starts_at)} is {alert.starts_at.timestamp() - now:.0f}s "
                               f"ahead of this host's clock (more than {MAX_CLOCK_SKEW:g}s)")
        return target

    def restarter(self, target: Target) -> Restarter:
        """The restarter of the Docker host the target lives on."""
        return self.restarts.restarter(target)

    def container(self, target: Target) -> Container:
        """The configured container, on the target's own host (ContainerNotFound, DockerError)."""
        return self.restarter(target).find(target.container)

    # -- the slow part, in the worker ---------------------------------------------------
    def run(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception as exc:  # a bug must still leave one line and never restart twice
            log.exception("unexpected error deciding for target %s", job.target.name)
            self.record(job.alert, job.target, SKIP, "internal_error", type(exc).__name__)

    def _recheck(self, alert: Alert, target: Target):
        """The webhook's own readings. For a stall alert (or a target that may be restarted for a
        stall) they also judge output: no token and no request answered across its own readings,
        ``recheck.interval`` apart, from one process that was running when the alert began."""
        kwargs = dict(module=target.module, interval=self.config.recheck.interval,
                      timeout=self.config.recheck.timeout, api_key=target.api_key, probe=target.probe)
        if alert.label("alertname") == STALL_ALERT or "stalled" in target.restart_on:
            kwargs["stall_window"] = 2 * self.config.recheck.interval
        return self.rechecker(target.url, **kwargs)

    def _unhealed_stall(self, alert: Alert, target: Target) -> bool:
        """Restarted for a stall within the cooldown, and stalled or hung again (its own re-check
        says so, about an alert that began after that restart): a restart does not heal it, so
        the circuit opens and people are told (HangwatchWebhookCircuitOpen). True when it did."""
        last = self.ledger.last_stall_restart(target.name)
        now = self.clock()
        if last is None or now - last >= self.config.cooldown:
            return False
        if alert.starts_at is None or alert.starts_at.timestamp() <= last:
            return False  # about the process before the restart: the cooldown skips it
        try:
            result = self._recheck(alert, target)
        except Exception:
            return False
        state = result.verdict.state
        if state not in ("hung", "stalled"):
            return False
        try:
            self.ledger.append({"event": "circuit_open", "at": now, "target": target.name, "replica": self.replica,
                                "verdict": state})
        except LedgerError as exc:
            self.record(alert, target, SKIP, "ledger_error", str(exc))
            return True
        self.record(alert, target, SKIP, "stall_not_healed",
                    f"restarted for a stall {now - last:.0f}s ago and {state} again: a restart does not heal it; "
                    f"circuit open ({result.verdict.reason})")
        log.error("CIRCUIT OPEN target=%s container=%s a restart for a stall did not heal it (%s again)",
                  target.name, target.container, state)
        return True

    def _run(self, job: Job) -> None:
        alert, target = job.alert, job.target
        if startup_applies(alert, target):
            self.startups.run(alert, target)  # startup.py: restarted once, then alert only
            return
        if self._unhealed_stall(alert, target):
            return
        if self._vetoed(alert, target, since=None, refresh=True) is None:
            return
        recheck_started = self.clock()
        try:
            result = self._recheck(alert, target)
            state, why = result.verdict.state, result.verdict.reason
        except Exception as exc:
            self.record(alert, target, SKIP, "recheck_error", f"{type(exc).__name__}: {exc}")
            return
        if state not in target.restart_on:
            reason = f"recheck_{state}" if f"recheck_{state}" in REASONS else "recheck_error"
            self.record(alert, target, SKIP, reason, why)
            return
        if not self._same_process(alert, target, result):
            return
        self._restart_under_lock(alert, target, result, recheck_started)

    def _restart_under_lock(self, alert: Alert, target: Target, result, recheck_started: float) -> None:
        """The final vetoes and the restart, under the target's lock (replicas restart once)."""
        if self.stopping:
            self.record(alert, target, SKIP, "shutting_down", STOPPING)
            return
        deadline = target.stop_timeout + 2 * self.config.recheck.timeout + 60 + (
            self.config.forensics_timeout if target.forensics_url else 0) + (
            self.config.escalate.timeout if self.config.escalate else 0)  # escalation.py runs under it too
        try:
            with target_lock(self.config.state_dir, target.name, deadline=deadline, cancelled=lambda: self.stopping):
                container = self._vetoed(alert, target, since=recheck_started, refresh=True)
                if container is None:
                    return
                if not self._begin_restart():
                    self.record(alert, target, SKIP, "shutting_down", STOPPING)
                    return
                try:
                    self.restarts.restart(alert, target, container, result)
                finally:
                    self._end_restart()
        except TimeoutError as exc:
            reason = "shutting_down" if self.stopping else "lock_timeout"
            self.record(alert, target, SKIP, reason, str(exc))
        except LedgerError as exc:  # a lock file that cannot be opened (e.g. a planted link): no restart
            self.record(alert, target, SKIP, "ledger_error", str(exc))

    def _same_process(self, alert: Alert, target: Target, result) -> bool:
        """Every reading of the re-check from a process started before the alert began (the one
        the alert saw); else skipped as already restarted."""
        if alert.starts_at is None:
            return True
        began = alert.starts_at.timestamp()
        for observation in result.observations:
            start = observation.reading.process_start if observation.reading is not None else None
            if start is not None and start > began:
                self.record(alert, target, SKIP, "already_restarted",
                            f"the re-check read a process started {iso_ts(start)}, after the alert began")
                return False
        return True

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
        except DockerError as exc:
            return self.record(alert, target, SKIP, "docker_unreachable", str(exc))
        if container.restarting or not container.running or container.paused:
            return self.record(alert, target, SKIP, "not_running", f"status={container.status}")
        started = container.started_at
        if started is not None:
            if alert.starts_at is not None and started > alert.starts_at:
                return self.record(alert, target, SKIP, "already_restarted",
                                   f"container started {iso(started)}, after the alert began {iso(alert.starts_at)}")
            if since is not None and started.timestamp() > since:
                return self.record(alert, target, SKIP, "already_restarted",
                                   f"container started {iso(started)}, during the re-check")
        now = self.clock()
        last = self.ledger.last_restart(target.name)
        if last is not None and now - last < self.config.cooldown:
            return self.record(alert, target, SKIP, "cooldown",
                               f"restarted {now - last:.0f}s ago; cooldown {self.config.cooldown:g}s")
        counted = self.ledger.restarts_counted(target.name, now, self.config.budget.window)
        if len(counted) >= self.config.budget.restarts:
            return self.record(alert, target, SKIP, "circuit_open", circuit_detail(self.config.budget, counted))
        if self.ledger.opened(target.name, now, self.config.budget.window):
            return self.record(alert, target, SKIP, "circuit_open",
                               "a restart for a stall did not heal it; POST /circuit/<target>/reset to close")
        return container

    # -- recovery watches (recovery.py) ------------------------------------------------------
    def watching(self) -> int:
        return self.watches.running()

    def wait_watches(self, timeout: float) -> bool:
        """True once no recovery watch runs; False if ``timeout`` s pass first."""
        return self.watches.wait(timeout)

    def stop_watching(self) -> None:
        self.watches.stop()

    def group_restarting(self) -> dict[str, int]:
        """Per group, how many of its targets are restarting now (for the gauge)."""
        try:
            self.ledger.refresh()
        except LedgerError as exc:
            log.error("%s", exc)
        now = self.clock()
        groups = sorted({t.group for t in self.config.targets if t.group is not None})
        return {group: len(limits.restarting(self.config, self.ledger, group, now)) for group in groups}

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
        self.watches.stop()
        with self._phase:
            self._stopping = True
            return self._phase.wait_for(lambda: not self._restarting, timeout)

    # -- bookkeeping --------------------------------------------------------------------
    def record(self, alert: Alert | None, target: Target | None, action: str, reason: str,
               detail: str = "", **extra) -> None:
        """One decision (``decisions.py``); returns None (for chaining)."""
        return self.decisions.record(alert, target, action, reason, detail, **extra)

    def circuit_open(self) -> dict[str, bool]:
        try:
            self.ledger.refresh()
        except LedgerError as exc:  # the last state read stays the answer
            log.error("%s", exc)
        now = self.clock()
        budget = self.config.budget
        return {t.name: len(self.ledger.restarts_counted(t.name, now, budget.window)) >= budget.restarts
                or self.ledger.opened(t.name, now, budget.window) for t in self.config.targets}

    def reset_circuit(self, target: Target) -> None:
        """Close the target's circuit; LedgerError if the reset could not be recorded (then it did not happen)."""
        at = self.clock()
        self.ledger.append({"event": "circuit_reset", "at": at, "target": target.name, "replica": self.replica})
        if self.ledger.reset_at(target.name) < at:
            raise LedgerError("the reset was written but does not read back")
        log.warning("circuit reset target=%s container=%s by operator request", target.name, target.container)
