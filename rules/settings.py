"""What differs between one Prometheus and another: the settings every rule is rendered with.

A leaf: ``render`` (which writes the files), ``windows`` and ``engine_rules`` (which build
expressions) all read ``Settings``; keeping it here, below all three, is what keeps them out of an
import circle (issue 34).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hangwatch.engines import ENGINES, EngineMetrics
from hangwatch.settings import ConfigError, duration

RUNBOOK_URL = "https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md"
DEFAULT_SCRAPE = 15.0


@dataclass(frozen=True)
class Settings:
    """What differs between one Prometheus and another."""

    scrape_interval: float = DEFAULT_SCRAPE   # seconds: the hangwatch job's scrape_interval
    job: str = "hangwatch"                    # the job scraping /probe (a regex, fully anchored)
    exporter_job: str = "hangwatch_exporter"  # the job scraping the exporter's own /metrics
    webhook_job: str = "hangwatch_webhook"    # the job scraping the webhook's own /metrics
    runbook_url: str = RUNBOOK_URL            # the runbook; alerts link to its sections
    # Tests and demos only: shrink wall-clock durations (minutes, engine grace) too.
    wall_clock_scale: float = 1.0
    engines: tuple[EngineMetrics, ...] = ENGINES
    # --stall-window: (engine name or "*" for every engine, seconds), later entries winning.
    stall_windows: tuple[tuple[str, float], ...] = ()
    # --gpu-labels (rules/gpu.py): (join labels, Xid window in seconds, Xid series names), or None.
    gpu: tuple | None = None

    def stall_window(self, engine: EngineMetrics) -> float:
        """The engine's stall window for these rules, in seconds (before ``wall_clock_scale``)."""
        window = engine.stall_window
        for name, seconds in self.stall_windows:
            if name in ("*", engine.name):
                window = seconds
        return window

    def __post_init__(self):
        if not self.scrape_interval >= 0.1:
            raise ConfigError(f"--scrape-interval: {self.scrape_interval:g}s is shorter than 100ms")
        if not re.fullmatch(r"https?://\S+", self.runbook_url):
            raise ConfigError(f"--runbook-url: {self.runbook_url!r} is not an http(s) URL")
        for flag, value in (("--job", self.job), ("--exporter-job", self.exporter_job),
                            ("--webhook-job", self.webhook_job)):
            if not value or '"' in value or "\\" in value or "\n" in value:
                raise ConfigError(f"{flag}: {value!r} is not a job name")
        known = {engine.name for engine in self.engines}
        for name, seconds in self.stall_windows:
            if name != "*" and name not in known:
                raise ConfigError(f"--stall-window: unknown engine {name!r} (one of {', '.join(sorted(known))})")
            if not seconds >= self.scrape_interval * 2:
                raise ConfigError(f"--stall-window: {seconds:g}s is shorter than two scrape intervals")


def parse_interval(text: str, flag: str = "--scrape-interval") -> float:
    return duration(text, flag, low=0.1, high=3600.0)


