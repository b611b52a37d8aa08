"""The exporter's YAML config, validated into a frozen dataclass before any port is bound.

The keys are documented in docs/configuration.md; the shared validation (durations, URLs,
unknown keys, errors naming the key's path) is ``hangwatch.settings``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hangwatch import liveness
from hangwatch.observation import PROBE_AUTO, PROBE_KINDS, Options
from hangwatch.settings import (ConfigError, boolean, duration, http_url, load_yaml, mapping, optional_duration,
                                secret_file, show)

__all__ = ["ConfigError", "ExporterConfig", "TargetSettings", "exporter_config", "load_exporter_config"]

KEYS = {"timeout", "timeout_offset", "allow_targets", "allow_any_target", "max_concurrent_probes",
        "max_connections", "read_timeout", "api_key_file", "targets",
        "liveness_interval", "liveness_timeout", "liveness_budget"}


@dataclass(frozen=True)
class TargetSettings:
    """How to read one backend URL: its own API key (from a file) and what the idle probe asks."""

    url: str
    api_key: str | None = field(default=None, repr=False)  # never printed
    probe: str | None = None  # None: the default (auto)
    stall_window: float | None = None  # None: the engine's default (hangwatch/engines.py)


@dataclass(frozen=True)
class ExporterConfig:
    timeout: float = 10.0           # budget per scrape when Prometheus does not send one
    timeout_offset: float = 0.5     # subtracted from Prometheus' scrape timeout
    allow_targets: tuple[str, ...] = ()  # empty: any target (listen on loopback then!)
    allow_any_target: bool = False  # beyond loopback without allow_targets: only if this is true
    max_concurrent_probes: int = 64  # probes read at once (on the loop or threads); more wait, then 503
    max_connections: int = 1024     # client connections open at once
    read_timeout: float = 5.0       # a request head must arrive within this
    api_key: str | None = field(default=None, repr=False)  # api_key_file: the default for every target
    targets: tuple[TargetSettings, ...] = ()
    # The bounded check behind /livez and /readyz (hangwatch.liveness).
    liveness_interval: float = liveness.INTERVAL
    liveness_timeout: float = liveness.TIMEOUT
    liveness_budget: float = liveness.BUDGET

    def __post_init__(self):
        object.__setattr__(self, "_allowed", frozenset(self.allow_targets))
        object.__setattr__(self, "_settings", {t.url: t for t in self.targets})

    def allows(self, target: str) -> bool:
        return not self.allow_targets or target.rstrip("/") in self._allowed

    def options_for(self, target: str, probe: str | None = None) -> Options:
        """The API key (the target's own, else the default) and probe kind for one target URL."""
        settings = self._settings.get(target.rstrip("/"))
        api_key = settings.api_key if settings and settings.api_key else self.api_key
        kind = probe or (settings.probe if settings and settings.probe else PROBE_AUTO)
        return Options(api_key=api_key, probe=kind, stall_window=settings.stall_window if settings else None)


def _count(data, key: str, default: int, low: int, high: int) -> int:
    if key not in data:
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: expected a whole number from {low} to {high}, got {show(value)}")
    return value


def probe_kind(value: Any, path: str) -> str:
    if value not in PROBE_KINDS:
        raise ConfigError(f"{path}: {show(value)} is not one of {', '.join(PROBE_KINDS)}")
    return value


def _target_settings(raw: Any, path: str) -> TargetSettings:
    data = mapping(raw, path, {"url", "api_key_file", "probe", "stall_window"}, required={"url"})
    return TargetSettings(
        url=http_url(data["url"], f"{path}.url", allow_path=True),
        api_key=secret_file(data["api_key_file"], f"{path}.api_key_file") if "api_key_file" in data else None,
        probe=probe_kind(data["probe"], f"{path}.probe") if "probe" in data else None,
        stall_window=duration(data["stall_window"], f"{path}.stall_window", low=1.0, high=7 * 86400.0)
        if "stall_window" in data else None)


def exporter_config(data: Any) -> ExporterConfig:
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {show(data)}")
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
    settings = data.get("targets", [])
    if not isinstance(settings, list):
        raise ConfigError("targets: expected a list of {url, api_key_file, probe, stall_window}")
    settings = tuple(_target_settings(t, f"targets[{i}]") for i, t in enumerate(settings))
    seen: dict[str, int] = {}
    for i, target in enumerate(settings):
        if target.url in seen:
            raise ConfigError(f"targets[{i}].url: {target.url!r} is already set by targets[{seen[target.url]}]")
        seen[target.url] = i
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
        allow_any_target=boolean(data["allow_any_target"], "allow_any_target")
        if "allow_any_target" in data else defaults.allow_any_target,
        max_concurrent_probes=_count(data, "max_concurrent_probes", defaults.max_concurrent_probes, 1, 4096),
        max_connections=_count(data, "max_connections", defaults.max_connections, 16, 1_000_000),
        read_timeout=read_timeout,
        api_key=secret_file(data["api_key_file"], "api_key_file") if "api_key_file" in data else None,
        targets=settings,
        liveness_interval=interval,
        liveness_timeout=check_timeout,
        liveness_budget=budget,
    )


def load_exporter_config(path: str | None) -> ExporterConfig:
    return ExporterConfig() if path is None else exporter_config(load_yaml(path))
