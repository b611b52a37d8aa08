"""The exporter's YAML config, validated into a frozen dataclass before any port is bound.

The keys are documented in docs/configuration.md; the shared validation (durations, URLs,
unknown keys, errors naming the key's path) is ``hangwatch.settings``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hangwatch.settings import ConfigError, boolean, duration, http_url, load_yaml, mapping, show

__all__ = ["ConfigError", "ExporterConfig", "exporter_config", "load_exporter_config"]

KEYS = {"timeout", "timeout_offset", "allow_targets", "allow_any_target", "max_concurrent_probes",
        "max_connections", "read_timeout"}


@dataclass(frozen=True)
class ExporterConfig:
    timeout: float = 10.0           # budget per scrape when Prometheus does not send one
    timeout_offset: float = 0.5     # subtracted from Prometheus' scrape timeout
    allow_targets: tuple[str, ...] = ()  # empty: any target (listen on loopback then!)
    allow_any_target: bool = False  # beyond loopback without allow_targets: only if this is true
    max_concurrent_probes: int = 64  # probes read at once (threads); more wait, then 503
    max_connections: int = 1024     # client connections open at once
    read_timeout: float = 5.0       # a request head must arrive within this

    def __post_init__(self):
        object.__setattr__(self, "_allowed", frozenset(self.allow_targets))

    def allows(self, target: str) -> bool:
        return not self.allow_targets or target.rstrip("/") in self._allowed


def _count(data, key: str, default: int, low: int, high: int) -> int:
    if key not in data:
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: expected a whole number from {low} to {high}, got {show(value)}")
    return value


def exporter_config(data: Any) -> ExporterConfig:
    data = mapping(data, "", KEYS)
    defaults = ExporterConfig()
    timeout = defaults.timeout
    if "timeout" in data:
        timeout = duration(data["timeout"], "timeout", low=0.001, high=3600)
    offset = defaults.timeout_offset
    if "timeout_offset" in data:
        offset = duration(data["timeout_offset"], "timeout_offset", high=3600)
    read_timeout = defaults.read_timeout
    if "read_timeout" in data:
        read_timeout = duration(data["read_timeout"], "read_timeout", low=0.1, high=300)
    targets = data.get("allow_targets", [])
    if not isinstance(targets, list):
        raise ConfigError("allow_targets: expected a list of URLs")
    return ExporterConfig(
        timeout=timeout,
        timeout_offset=offset,
        allow_targets=tuple(http_url(t, f"allow_targets[{i}]", allow_path=True) for i, t in enumerate(targets)),
        allow_any_target=boolean(data["allow_any_target"], "allow_any_target")
        if "allow_any_target" in data else defaults.allow_any_target,
        max_concurrent_probes=_count(data, "max_concurrent_probes", defaults.max_concurrent_probes, 1, 4096),
        max_connections=_count(data, "max_connections", defaults.max_connections, 16, 1_000_000),
        read_timeout=read_timeout,
    )


def load_exporter_config(path: str | None) -> ExporterConfig:
    return ExporterConfig() if path is None else exporter_config(load_yaml(path))
