"""The webhook's own /metrics, on a private registry (one per app, so tests never collide).

Counters are kept in memory (they restart with the process, as counters may); the circuit
gauge is computed from the ledger at every scrape, so it closes by itself when the budget
window passes and agrees with what a second replica did. Sample::

    hangwatch_webhook_requests_total{code="200"} 3.0
    hangwatch_webhook_decisions_total{action="skip",reason="recheck_busy"} 1.0
    hangwatch_webhook_restarts_total{result="ok",target="vllm-a"} 1.0
    hangwatch_webhook_circuit_open{target="vllm-a"} 0.0
    hangwatch_webhook_jobs_in_progress 0.0
    hangwatch_build_info{python_version="3.11.2",version="0.3.0"} 1.0
"""
from __future__ import annotations

import platform
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily

from hangwatch import __version__

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StateCollector:
    def __init__(self, circuit_open: Callable[[], dict[str, bool]], jobs: Callable[[], int]):
        self._circuit_open = circuit_open
        self._jobs = jobs

    def describe(self):  # so registering does not call collect() before the app exists
        yield GaugeMetricFamily("hangwatch_webhook_circuit_open", "", labels=["target"])
        yield GaugeMetricFamily("hangwatch_webhook_jobs_in_progress", "")

    def collect(self):
        circuit = GaugeMetricFamily("hangwatch_webhook_circuit_open",
                                    "1 while the target's restart budget is spent: no restarts until "
                                    "the window passes or POST /circuit/<target>/reset", labels=["target"])
        for target, is_open in sorted(self._circuit_open().items()):
            circuit.add_metric([target], 1.0 if is_open else 0.0)
        yield circuit
        yield GaugeMetricFamily("hangwatch_webhook_jobs_in_progress",
                                "re-check/restart jobs queued or running", value=self._jobs())


class WebhookMetrics:
    def __init__(self, circuit_open: Callable[[], dict[str, bool]], jobs: Callable[[], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("hangwatch_webhook_requests", "HTTP requests answered, by status code",
                                ["code"], registry=self.registry)
        self.decisions = Counter("hangwatch_webhook_decisions", "decisions about alerts, by action and reason",
                                 ["action", "reason"], registry=self.registry)
        self.restarts = Counter("hangwatch_webhook_restarts", "container restarts, by target and result",
                                ["target", "result"], registry=self.registry)
        self.registry.register(_StateCollector(circuit_open, jobs))
        # node_exporter's build_info: which hangwatch (and Python) answers, as labels on a constant 1.
        Info("hangwatch_build", "The hangwatch version and the Python it runs on.", registry=self.registry).info(
            {"version": __version__, "python_version": platform.python_version()})

    def preset(self, targets, reasons, restart_reasons=("hung",)) -> None:
        """Create every series at 0, so rate(), increase() and annotations see the first event."""
        for reason in reasons:
            self.decisions.labels("restart" if reason in restart_reasons else "skip", reason)
        for target in targets:
            for result in ("ok", "failed"):
                self.restarts.labels(target, result)

    def render(self) -> bytes:
        return generate_latest(self.registry)
