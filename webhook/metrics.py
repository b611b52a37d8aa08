"""The webhook's own /metrics, on a private registry (one per app, so tests never collide).

Counters are kept in memory (they restart with the process, as counters may); the circuit
gauge is computed from the ledger at every scrape, so it closes by itself when the budget
window passes and agrees with what a second replica did. Sample::

    hangwatch_webhook_requests_total{code="200"} 3.0
    hangwatch_webhook_decisions_total{action="skip",reason="recheck_busy"} 1.0
    hangwatch_webhook_restarts_total{result="ok",target="vllm-a"} 1.0
    hangwatch_webhook_circuit_open{target="vllm-a"} 0.0
    hangwatch_webhook_jobs_in_progress 0.0
    hangwatch_webhook_restarts_withheld_total{group="llama-70b",limit="group",target="vllm-a"} 0.0
    hangwatch_webhook_group_restarting{group="llama-70b"} 1.0
    hangwatch_webhook_alert_only_total{class="hardware",target="vllm-a"} 1.0
    hangwatch_webhook_escalations_total{outcome="ok"} 1.0
    hangwatch_webhook_last_restart_timestamp_seconds{signature="engine_step_stuck",target="vllm-a"} 1.7649e+09
    hangwatch_build_info{python_version="3.11.2",version="0.3.0"} 1.0

A withheld restart is a target the re-check proved hung and a fleet-wide limit kept the
webhook from restarting (``limits.py``): it is left to people, so it has its own series with
the target and group, for an alert to name them.

The last restart of each target carries its forensics signature (``none`` without a capture)
as a label on the restart's time, one series per target: the alerts' query templates and the
dashboard's restart annotation join it in, so the signature reaches people beside the restart.
It lives in memory: a webhook that restarts forgets it until its next restart of that target.
"""
from __future__ import annotations

import platform
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily

from hangwatch import __version__
from hangwatch.forensics.logsignatures import CLASSES

from .escalation import OUTCOMES as ESCALATION_OUTCOMES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector:
    def __init__(self, circuit_open: Callable[[], dict[str, bool]], jobs: Callable[[], int],
                 group_restarting: Callable[[], dict[str, int]]):
        self._circuit_open = circuit_open
        self._jobs = jobs
        self._group_restarting = group_restarting

    def describe(self):  # so registering does not call collect() before the app exists
        yield GaugeMetricFamily("hangwatch_webhook_circuit_open", "", labels=["target"])
        yield GaugeMetricFamily("hangwatch_webhook_jobs_in_progress", "")
        yield GaugeMetricFamily("hangwatch_webhook_group_restarting", "", labels=["group"])

    def collect(self):
        circuit = GaugeMetricFamily("hangwatch_webhook_circuit_open",
                                    "1 while the target's restart budget is spent: no restarts until "
                                    "the window passes or POST /circuit/<target>/reset", labels=["target"])
        for target, is_open in sorted(self._circuit_open().items()):
            circuit.add_metric([target], 1.0 if is_open else 0.0)
        yield circuit
        yield GaugeMetricFamily("hangwatch_webhook_jobs_in_progress",
                                "re-check/restart jobs queued or running", value=self._jobs())
        restarting = GaugeMetricFamily("hangwatch_webhook_group_restarting",
                                       "targets of the group restarting now: restarted, not yet seen idle or "
                                       "busy again, within recovery (group_limit counts these)", labels=["group"])
        for group, count in sorted(self._group_restarting().items()):
            restarting.add_metric([group], float(count))
        yield restarting


class WebhookMetrics:
    def __init__(self, circuit_open: Callable[[], dict[str, bool]], jobs: Callable[[], int],
                 group_restarting: Callable[[], dict[str, int]] = dict):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("hangwatch_webhook_requests", "HTTP requests answered, by status code",
                                ["code"], registry=self.registry)
        self.decisions = Counter("hangwatch_webhook_decisions", "decisions about alerts, by action and reason",
                                 ["action", "reason"], registry=self.registry)
        self.restarts = Counter("hangwatch_webhook_restarts", "container restarts, by target and result",
                                ["target", "result"], registry=self.registry)
        self.withheld = Counter("hangwatch_webhook_restarts_withheld",
                                "targets re-checked hung and not restarted because a fleet-wide limit was "
                                "reached (limit: group = group_limit, fleet = fleet_budget); left to people",
                                ["target", "group", "limit"], registry=self.registry)
        self.last_restart = Gauge("hangwatch_webhook_last_restart_timestamp_seconds",
                                  "when the webhook last restarted the target (Unix time), with the forensics "
                                  "signature of that restart (none: no capture)", ["target", "signature"],
                                  registry=self.registry)
        self.alert_only = Counter("hangwatch_webhook_alert_only",
                                  "hangs proved and not restarted because the signature's class says a restart "
                                  "cannot help (policy alert_only; one per hung process): left to people",
                                  ["target", "class"], registry=self.registry)
        self.escalations = Counter("hangwatch_webhook_escalations",
                                   "escalate actions run (circuit open or alert_only), by outcome",
                                   ["outcome"], registry=self.registry)
        self._signatures: dict[str, str] = {}
        self._signatures_lock = threading.Lock()
        self.registry.register(_StateCollector(circuit_open, jobs, group_restarting))
        # node_exporter's build_info: which hangwatch (and Python) answers, as labels on a constant 1.
        Info("hangwatch_build", "The hangwatch version and the Python it runs on.", registry=self.registry).info(
            {"version": __version__, "python_version": platform.python_version()})

    def preset(self, targets, reasons, restart_reasons=("hung", "startup_stuck"), groups=None,
               results=("ok", "failed")) -> None:
        """Create every series at 0, so rate(), increase() and annotations see the first event.
        ``groups``: target name -> its group (None: no group). ``results``: the restart results
        this webhook can count (``dry_run`` alone in a dry run)."""
        for reason in reasons:
            self.decisions.labels("restart" if reason in restart_reasons else "skip", reason)
        for target in targets:
            for result in results:
                self.restarts.labels(target, result)
            group = (groups or {}).get(target)
            for limit in (("group", "fleet") if group else ("fleet",)):
                self.withheld.labels(target, group or "", limit)
            for klass in CLASSES:
                self.alert_only.labels(target, klass)
        for outcome in ESCALATION_OUTCOMES:
            self.escalations.labels(outcome)

    def note_restart(self, target: str, signature: str | None, at: float) -> None:
        """The target's last restart and its signature: replaces the target's previous series, so
        each target has one and a join on ``target`` never meets two."""
        signature = signature or "none"
        with self._signatures_lock:
            previous = self._signatures.get(target)
            if previous is not None and previous != signature:
                self.last_restart.remove(target, previous)
            self._signatures[target] = signature
            self.last_restart.labels(target, signature).set(at)

    def render(self) -> bytes:
        return generate_latest(self.registry)
