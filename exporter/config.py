"""The exporter's YAML config, validated into a frozen dataclass before any port is bound.

The keys are documented in docs/configuration.md; the shared validation (durations, URLs,
unknown keys, errors naming the key's path) is ``hangwatch.settings``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hangwatch import liveness
from hangwatch.settings import ConfigError, duration, http_url, load_yaml, mapping, optional_duration

__all__ = ["ConfigError", "ExporterConfig", "exporter_config", "load_exporter_config"]


@dataclass(frozen=True)
class ExporterConfig:
    timeout: float = 10.0           # budget per scrape when Prometheus does not send one
    timeout_offset: float = 0.5     # subtracted from Prometheus' scrape timeout
    allow_targets: tuple[str, ...] = ()  # empty: any target (listen on loopback then!)
    # The bounded check behind /livez and /readyz (hangwatch.liveness).
    liveness_interval: float = liveness.INTERVAL
    liveness_timeout: float = liveness.TIMEOUT
    liveness_budget: float = liveness.BUDGET

    def allows(self, target: str) -> bool:
        return not self.allow_targets or target.rstrip("/") in self.allow_targets


def exporter_config(data: Any) -> ExporterConfig:
    data = mapping(data, "", {"timeout", "timeout_offset", "allow_targets",
                              "liveness_interval", "liveness_timeout", "liveness_budget"})
    defaults = ExporterConfig()
    timeout = defaults.timeout
    if "timeout" in data:
        timeout = duration(data["timeout"], "timeout", low=0.001, high=3600)
    offset = defaults.timeout_offset
    if "timeout_offset" in data:
        offset = duration(data["timeout_offset"], "timeout_offset", high=3600)
    targets = data.get("allow_targets", [])
    if not isinstance(targets, list):
        raise ConfigError("allow_targets: expected a list of URLs")
    interval = optional_duration(data, "liveness_interval", "", defaults.liveness_interval, 0.01, 600)
    check_timeout = optional_duration(data, "liveness_timeout", "", defaults.liveness_timeout, 0.01, 600)
    budget = optional_duration(data, "liveness_budget", "", defaults.liveness_budget, 0.01, 3600)
    problem = liveness.budget_error(interval, check_timeout, budget)
    if problem:
        raise ConfigError(f"liveness_budget: {problem}")
    return ExporterConfig(
        timeout=timeout,
        timeout_offset=offset,
        allow_targets=tuple(http_url(t, f"allow_targets[{i}]", allow_path=True) for i, t in enumerate(targets)),
        liveness_interval=interval,
        liveness_timeout=check_timeout,
        liveness_budget=budget,
    )


def load_exporter_config(path: str | None) -> ExporterConfig:
    return ExporterConfig() if path is None else exporter_config(load_yaml(path))
