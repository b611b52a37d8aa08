"""Decide, for one alert about one configured target, whether to restart — and do it once.

The alert is only a hint. A restart needs all of: the alert began no later than now (plus a
small clock skew); the container exists, runs, and has not been (re)started since the alert
began; the target is out of its cooldown and inside its restart budget; the webhook's
*own* re-check of the backend (the verdict core in ``hangwatch.check``) says ``hung``; and
the fleet-wide limits (``limits.py``: per group, across the fleet) leave room. The final
checks and the restart run under a file lock per target, after re-reading the ledger, so two
replicas sharing a state_dir restart once; the fleet-wide limits are checked and the restart
recorded as one step under the fleet lock, so they hold across replicas too. No restart
without its records: the incident record and the ledger's restart line are written first,
and if either cannot be written the answer is no (``ledger_error``).

Each target lives on one Docker host (``Target.docker_host``), reached through its own
restarter: the container lookup, the "already restarted since the alert began" check, the
log tail and the restart all go to that host; cooldown, budget, circuit and incident records
are per target, wherever it lives. A restart of a target in a ``group`` is followed by a
*recovery watch*: the verdict core reads the backend until it is idle or busy again (a
``recovered`` ledger line, which settles the restart for the group limit) or ``recovery``
has passed.

Every outcome is one log line and one counter; every decision about a configured target is
also one ledger line. Alerts that are not ours to act on (resolved, another alertname, an
unknown target, a container label that does not match) are only logged and counted: Alertmanager
sends them at every group interval, and a ledger line each would grow it without telling anyone
anything the counter does not.

The Docker host are behind ``restarter.Restarter``; this module never imports Docker.
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
from typing import Callable, Mapping

from hangwatch.forensics.capture import scrub

from . import limits
from .config import STALL_ALERT, Config, Target
from .forensics import ask as ask_forensics
from .ledger import Ledger, LedgerError, fleet_lock, target_lock, write_incident
from .metrics import WebhookMetrics
from .payload import Alert
from .restarter import Container, ContainerNotFound, DockerError, Restarter

log = logging.getLogger("hangwatch.webhook")

RESTART, SKIP = "restart", "skip"
LOG_TAIL_LINES = 100
MAX_SHOWN = 120         # characters of an untrusted label value in a log line
MAX_CLOCK_SKEW = 30.0   # seconds an alert's startsAt may lie ahead of our clock
STOPPING = "re-check said hung while the webhook was stopping"
FLEET_LOCK_DEADLINE = 30.0  # seconds; the fleet lock is held for a ledger read and two writes
HEALTHY = ("idle", "busy")  # what the recovery watch must see to settle a restart

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
    def __init__(self, config: Config, *, restarter: Restarter | Mapping[str, Restarter], clock: Callable[[], float],
                 rechecker, ledger: Ledger, metrics: WebhookMetrics, dry_run: bool, replica: str | None = None,
                 forensics: Callable[[str, str, float], dict] | None = None):
        self.config = config
        self.forensics = forensics or ask_forensics
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
        self._unwatch = threading.Event()   # set: recovery watches end at once
        self._watches: set[threading.Thread] = set()

    # -- the cheap part, in the request -------------------------------------------------
    def triage(self, alert: Alert) -> Target | None:
        """The configured target this alert may act on, or None (the skip is recorded)."""
        name = alert.label("alertname")
        if not alert.firing:
            return self.record(alert, None, SKIP, "resolved")
        if name not in self.config.alertnames and name != STALL_ALERT:
            return self.record(alert, None, SKIP, "alertname_ignored")
        target = self.config.target(alert.label("target") or "")
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
                               f"startsAt {_iso(alert.starts_at)} is {alert.starts_at.timestamp() - now:.0f}s "
                               f"ahead of this host's clock (more than {MAX_CLOCK_SKEW:g}s)")
        return target

    def restarter(self, target: Target) -> Restarter:
        """The restarter of the Docker host the target lives on."""
        return self.hosts[target.docker_host.name]

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
        if self.stopping:
            self.record(alert, target, SKIP, "shutting_down", STOPPING)
            return
        deadline = target.stop_timeout + 2 * self.config.recheck.timeout + 60 + (
            self.config.forensics_timeout if target.forensics_url else 0)
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
                            f"the re-check read a process started {_iso_ts(start)}, after the alert began")
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
        if self.ledger.opened(target.name, now, self.config.budget.window):
            return self.record(alert, target, SKIP, "circuit_open",
                               "a restart for a stall did not heal it; POST /circuit/<target>/reset to close")
        return container

    def _restart(self, alert: Alert, target: Target, container: Container, result) -> None:
        if self.dry_run:
            # Counted per target like a restart, so the dashboard's restart annotation marks
            # what a dry run would have done ("restart of vllm-a: dry_run").
            self.metrics.restarts.labels(target.name, "dry_run").inc()
            self.record(alert, target, RESTART, result.verdict.state, result.verdict.reason, dry_run=True)
            return
        stacks = self._capture(target)  # once per restart: the vetoes above hold under the target's lock
        incident = {
            "target": target.name, "container": target.container, "container_id": container.id,
            "docker_host": target.docker_host.name, "group": target.group,
            "url": target.url, "module": target.module, "replica": self.replica,
            "alert": {"labels": {k: v[:512] for k, v in list(alert.labels.items())[:64]},
                      "startsAt": _iso(alert.starts_at)},
            "container_started_at": container.started_at_text,
            "recheck": _safe(result.as_json),
            "observations": [_safe(o.as_dict) for o in result.observations],
            "logs": self._log_tail(target, container),  # a Docker call: before the fleet lock, not under it
        }
        signed = {}
        if stacks is not None:
            incident |= {"forensics": stacks, "signature": stacks.get("signature")}
            signed = {"signature": stacks.get("signature") or "none"}
        try:
            recorded = self._record_restart(alert, target, incident, result.verdict.state)
        except TimeoutError as exc:
            self.record(alert, target, SKIP, "shutting_down" if self.stopping else "lock_timeout", str(exc))
            return
        if recorded is None:
            return
        now, path = recorded
        try:
            self.restarter(target).restart(container, target.stop_timeout)
            outcome, detail = "ok", result.verdict.reason
        except Exception as exc:
            outcome, detail = "failed", f"restart failed: {type(exc).__name__}: {str(exc)[:200]}"
        self.metrics.restarts.labels(target.name, outcome).inc()
        self.record(alert, target, RESTART, result.verdict.state, detail, result=outcome, incident=path, **signed)
        if outcome == "ok" and target.group is not None:
            self._watch_recovery(target, now)
        counted = self.ledger.restarts_counted(target.name, self.clock(), self.config.budget.window)
        if len(counted) >= self.config.budget.restarts:
            log.error("CIRCUIT OPEN target=%s container=%s %s", target.name, target.container,
                      self._circuit_detail(counted))

    def _capture(self, target: Target) -> dict | None:
        """The stacks from the target's forensics place (None: none configured), within the deadline."""
        if target.forensics_url is None:
            return None
        try:
            answer = self.forensics(target.forensics_url, target.url, self.config.forensics_timeout)
        except Exception as exc:  # the restart goes on whatever the capture does
            answer = {"signature": None, "processes": [], "errors": [f"capture failed: {type(exc).__name__}: {exc}"]}
        return scrub(answer, [target.api_key] if target.api_key else [])  # the exporter scrubbed too; keys never land here

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
                incident["decided_at"] = _iso_ts(now)
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

    # -- after a restart: is the backend healthy again? -------------------------------------
    def _watch_recovery(self, target: Target, restarted_at: float) -> None:
        thread = threading.Thread(target=self._watch, args=(target, restarted_at), daemon=True,
                                  name=f"hangwatch-recovery-{target.name}")
        with self._phase:
            if self._stopping or self._unwatch.is_set():
                return
            self._watches.add(thread)
        thread.start()

    def _watch(self, target: Target, restarted_at: float) -> None:
        """Read the backend with the verdict core until it is idle or busy (a ``recovered`` line)
        or ``recovery`` has passed since the restart; ends at once when the webhook stops."""
        try:
            deadline = restarted_at + self.config.recovery
            while not self._unwatch.is_set() and self.clock() < deadline:
                try:
                    state = self.rechecker(target.url, module=target.module, interval=self.config.recheck.interval,
                                           timeout=self.config.recheck.timeout, api_key=target.api_key,
                                           probe=target.probe).verdict.state
                except Exception as exc:  # a backend still loading may fail oddly: keep watching
                    state = f"error ({type(exc).__name__})"
                if state in HEALTHY and not self._unwatch.is_set():
                    now = self.clock()
                    try:
                        self.ledger.append({"event": "recovered", "at": now, "target": target.name,
                                            "restart_at": restarted_at, "verdict": state, "replica": self.replica})
                    except LedgerError as exc:  # the restart then holds the slot until recovery passes
                        log.error("ledger: cannot record that %s recovered: %s", target.name, exc)
                        return
                    log.info("recovered target=%s docker_host=%s verdict=%s after=%.0fs", target.name,
                             target.docker_host.name, state, now - restarted_at)
                    return
                self._unwatch.wait(self.config.recheck.interval)
            if not self._unwatch.is_set():
                log.warning("not recovered target=%s docker_host=%s: not idle or busy within recovery %gs "
                            "of its restart; it no longer counts as restarting for group %s",
                            target.name, target.docker_host.name, self.config.recovery, target.group)
        finally:
            with self._phase:
                self._watches.discard(threading.current_thread())
                self._phase.notify_all()

    def watching(self) -> int:
        with self._phase:
            return len(self._watches)

    def wait_watches(self, timeout: float) -> bool:
        """True once no recovery watch runs; False if ``timeout`` s pass first."""
        deadline = time.monotonic() + timeout
        with self._phase:
            while self._watches:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._phase.wait(left)
        return True

    def stop_watching(self) -> None:
        self._unwatch.set()

    def group_restarting(self) -> dict[str, int]:
        """Per group, how many of its targets are restarting now (for the gauge)."""
        try:
            self.ledger.refresh()
        except LedgerError as exc:
            log.error("%s", exc)
        now = self.clock()
        groups = sorted({t.group for t in self.config.targets if t.group is not None})
        return {group: len(limits.restarting(self.config, self.ledger, group, now)) for group in groups}

    def _circuit_detail(self, counted: list[float]) -> str:
        budget = self.config.budget
        closes = min(counted) + budget.window
        return (f"{len(counted)} restarts within {budget.window:g}s (budget {budget.restarts}); no restarts "
                f"until {_iso_ts(closes)} or POST /circuit/<target>/reset")

    def _log_tail(self, target: Target, container: Container) -> list[str]:
        try:
            return self.restarter(target).log_tail(container, LOG_TAIL_LINES)[-LOG_TAIL_LINES:]
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
        self._unwatch.set()
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
        if target is not None:
            fields.append(("docker_host", target.docker_host.name))
        if detail:
            fields.append(("detail", detail))
        line = " ".join(f"{key}={show(value)}" for key, value in fields)
        level = logging.ERROR if reason in ("circuit_open", "ledger_error", "group_limit", "fleet_limit") \
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
                "alertname": _cut(alertname), "target": _cut(target_name), "container": _cut(container),
                "action": action, "reason": reason, "dry_run": action == RESTART and self.dry_run,
                "docker_host": target.docker_host.name if target else None,
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
                or self.ledger.opened(t.name, now, budget.window) for t in self.config.targets}

    def reset_circuit(self, target: Target) -> None:
        """Close the target's circuit; LedgerError if the reset could not be recorded (then it did not happen)."""
        at = self.clock()
        self.ledger.append({"event": "circuit_reset", "at": at, "target": target.name, "replica": self.replica})
        if self.ledger.reset_at(target.name) < at:
            raise LedgerError("the reset was written but does not read back")
        log.warning("circuit reset target=%s container=%s by operator request", target.name, target.container)


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


def _cut(value, limit: int = 200):
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    return value


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def _iso_ts(seconds: float) -> str:
    return _iso(datetime.fromtimestamp(seconds, timezone.utc))
