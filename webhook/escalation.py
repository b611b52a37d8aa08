"""When a restart cannot help: start the team's way out, once per incident, within one deadline.

An open circuit or an ``alert_only`` policy ends in an alert; where the team has a way out —
cordon the node, take the backend out of its router, page the on-call — the webhook config's
``escalate`` starts it: a command (argv, no shell: the incident's JSON on its stdin and its
essentials in ``HANGWATCH_*`` variables) or an HTTP POST of the incident's JSON to a URL. It runs
once per incident (the ledger's ``escalation`` line is the memory, so re-sent alerts and a
second replica do not run it again), never longer than ``timeout`` (a command is killed with its
whole process group), and its outcome goes to the ledger and to
``hangwatch_webhook_escalations_total{outcome}``. It never restarts anything.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Callable

import requests

from hangwatch.settings import ConfigError, http_url, mapping, optional_duration, show, string_list

log = logging.getLogger("hangwatch.webhook")

OUTCOMES = ("ok", "failed", "timeout", "error")  # the `outcome` label of escalations_total
MAX_OUTPUT = 2000                                # characters of a command's output kept in the ledger


@dataclass(frozen=True)
class Escalate:
    command: tuple[str, ...] | None = None
    url: str | None = None
    timeout: float = 30.0


def parse_escalate(raw) -> Escalate | None:
    """The ``escalate`` key: exactly one of ``command`` (a non-empty argv list) and ``url``."""
    if raw is None:
        return None
    data = mapping(raw, "escalate", {"command", "url", "timeout"})
    if ("command" in data) == ("url" in data):
        raise ConfigError(f"escalate: expected exactly one of command (argv list) and url, got {show(raw)}")
    timeout = optional_duration(data, "timeout", "escalate", Escalate.timeout, 0.1, 600)
    if "command" in data:
        if not isinstance(data["command"], list):
            raise ConfigError("escalate.command: expected a list of arguments (argv, no shell), "
                              f"got {show(data['command'])}")
        command = tuple(string_list(data["command"], "escalate.command", non_empty=True))
        return Escalate(command=command, timeout=timeout)
    return Escalate(url=http_url(data["url"], "escalate.url", allow_path=True), timeout=timeout)


@dataclass(frozen=True)
class Outcome:
    outcome: str      # one of OUTCOMES
    detail: str


def run(escalate: Escalate, incident: dict, *, post: Callable = requests.post) -> Outcome:
    """Run the action once with the incident, bounded by ``escalate.timeout``."""
    body = json.dumps(incident, sort_keys=True, default=str)
    if escalate.url is not None:
        return _post(escalate, body, post)
    return _command(escalate, incident, body)


def _post(escalate: Escalate, body: str, post: Callable) -> Outcome:
    try:
        answer = post(escalate.url, data=body.encode(), headers={"Content-Type": "application/json"},
                      timeout=(min(5.0, escalate.timeout), escalate.timeout))
    except requests.Timeout:
        return Outcome("timeout", f"POST {escalate.url}: no answer within {escalate.timeout:g}s")
    except requests.RequestException as exc:
        return Outcome("error", f"POST {escalate.url}: {type(exc).__name__}")
    if 200 <= answer.status_code < 300:
        return Outcome("ok", f"POST {escalate.url}: HTTP {answer.status_code}")
    return Outcome("failed", f"POST {escalate.url}: HTTP {answer.status_code}")


def _command(escalate: Escalate, incident: dict, body: str) -> Outcome:
    shown = " ".join(escalate.command)[:200]
    env = {**os.environ, "HANGWATCH_TARGET": str(incident.get("target") or ""),
           "HANGWATCH_CONTAINER": str(incident.get("container") or ""),
           "HANGWATCH_REASON": str(incident.get("escalated_for") or ""),
           "HANGWATCH_CLASS": str(incident.get("class") or ""),
           "HANGWATCH_INCIDENT": str(incident.get("incident") or "")}
    try:
        process = subprocess.Popen(list(escalate.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except OSError as exc:
        return Outcome("error", f"{shown}: cannot start: {exc.strerror or exc}")
    try:
        output, _ = process.communicate(body.encode(), timeout=escalate.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return Outcome("timeout", f"{shown}: still running after {escalate.timeout:g}s; killed")
    text = output.decode("utf-8", errors="replace").strip()[-MAX_OUTPUT:]
    if process.returncode == 0:
        return Outcome("ok", f"{shown}: exit 0" + (f": {text}" if text else ""))
    return Outcome("failed", f"{shown}: exit {process.returncode}" + (f": {text}" if text else ""))


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the command and everything it started (its own session), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()
    try:
        process.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a grandchild that left the group still holds the pipe
        for stream in (process.stdout, process.stdin):
            try:
                stream.close()
            except Exception:
                pass
        process.wait(timeout=5)


class Escalations:
    """Runs ``config.escalate`` once per incident key (the ledger remembers), records the outcome."""

    def __init__(self, config, *, ledger, metrics, clock: Callable[[], float], replica: str,
                 post: Callable = requests.post):
        self.config = config
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.replica = replica
        self.post = post

    def escalate(self, target, *, key: str, incident: dict, incident_path: str | None, reason: str) -> str | None:
        """The outcome, or None when nothing ran (no ``escalate`` configured, or already run for ``key``)."""
        escalate = self.config.escalate
        if escalate is None:
            return None
        try:
            self.ledger.refresh()
        except Exception as exc:  # cannot tell whether it ran: not again (a page twice is worse than late)
            log.error("escalation for %s not run: the ledger cannot be read: %s", target.name, exc)
            return None
        if self.ledger.escalated(target.name, key):
            return None
        began = self.clock()
        # Claimed before it runs: a crash mid-run must not run it again at the next re-send.
        record = {"event": "escalation", "at": began, "target": target.name, "key": key, "reason": reason,
                  "incident": incident_path, "replica": self.replica, "outcome": "started"}
        try:
            self.ledger.append(record)
        except Exception as exc:
            log.error("escalation for %s not run: cannot record it: %s", target.name, exc)
            return None
        result = run(escalate, {**incident, "escalated_for": reason, "incident": incident_path}, post=self.post)
        self.metrics.escalations.labels(result.outcome).inc()
        level = logging.WARNING if result.outcome == "ok" else logging.ERROR
        log.log(level, "escalation target=%s reason=%s outcome=%s detail=%s", target.name, reason, result.outcome,
                show(result.detail))
        try:
            self.ledger.append(record | {"at": self.clock(), "outcome": result.outcome, "detail": result.detail,
                                         "seconds": round(self.clock() - began, 3)})
        except Exception as exc:
            log.error("escalation outcome for %s not recorded: %s", target.name, exc)
        return result.outcome
