"""The exporter's YAML config, validated into a frozen dataclass before any port is bound.

The keys are documented in docs/configuration.md; the shared validation is the core's
(``hangwatch.settings``, and ``hangwatch.target_options`` for each of ``targets``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hangwatch import liveness
from hangwatch.forensics.capture import MAX_CONCURRENT, MAX_PROCESSES
from hangwatch.forensics.guard import MIN_INTERVAL
from hangwatch.forensics.pins import CONTAINER_ID, Pin
from hangwatch.forensics.pyspy import MAX_OUTPUT_BYTES
from hangwatch.forensics.targets import TargetError, canonical_url
from hangwatch.observation import PROBE_AUTO, PROBE_NONE, Options
from hangwatch.settings import (
    ConfigError,
    boolean,
    duration,
    http_url,
    load_yaml,
    mapping,
    optional_duration,
    secret_file,
    show,
    string,
)
from hangwatch.target_options import KEYS as TARGET_KEYS
from hangwatch.target_options import TargetOptions, target_options

__all__ = ["ConfigError", "ExporterConfig", "exporter_config", "load_exporter_config"]

KEYS = {"timeout", "timeout_offset", "allow_targets", "allow_any_target", "max_concurrent_probes",
        "max_connections", "read_timeout", "api_key_file", "targets",
        "liveness_interval", "liveness_timeout", "liveness_budget", "forensics", "startup_deadline"}


@dataclass(frozen=True)
class ForensicsSettings:
    """``GET /forensics``: off unless enabled (and then only for targets listed exactly); the
    capture's deadline, its bounds, how often, who may ask, and where pinned targets' processes are."""

    enabled: bool = False
    deadline: float = 10.0
    locals: bool = False
    native: bool = False
    py_spy: str | None = None
    min_interval: float = MIN_INTERVAL
    max_processes: int = MAX_PROCESSES
    max_concurrent: int = MAX_CONCURRENT
    max_output_bytes: int = MAX_OUTPUT_BYTES
    token: str | None = field(default=None, repr=False)  # token_file: then /forensics needs the bearer token
    pins: tuple[tuple[str, Pin], ...] = ()  # (canonical URL, where its processes are)

    def pin_for(self, canonical: str) -> Pin | None:
        return dict(self.pins).get(canonical)


@dataclass(frozen=True)
class ExporterConfig:
    timeout: float = 10.0           # budget per scrape when Prometheus does not send one
    timeout_offset: float = 0.5     # subtracted from Prometheus' scrape timeout
    allow_targets: tuple[str, ...] = ()  # empty: any target (listen on loopback then!)
    allow_any_target: bool = False  # beyond loopback without allow_targets: only if this is true
    max_concurrent_probes: int = 64  # probes doing work at once (not waiting); more wait, then 503
    max_connections: int = 1024     # client connections open at once
    read_timeout: float = 5.0       # a request head must arrive within this
    api_key: str | None = field(default=None, repr=False)  # api_key_file: the default, for allow_targets only
    targets: tuple[TargetOptions, ...] = ()
    # The bounded check behind /livez and /readyz (hangwatch.liveness).
    liveness_interval: float = liveness.INTERVAL
    liveness_timeout: float = liveness.TIMEOUT
    liveness_budget: float = liveness.BUDGET
    forensics: ForensicsSettings = ForensicsSettings()
    startup_deadline: liveness.StartupDeadline | None = None  # none: down (loading) is never past a deadline

    def __post_init__(self):
        object.__setattr__(self, "_allowed", frozenset(self.allow_targets))
        object.__setattr__(self, "_settings", {t.url: t for t in self.targets})
        listed = {}
        for url in (*self.allow_targets, *(t.url for t in self.targets)):
            try:
                listed.setdefault(canonical_url(url), url.rstrip("/"))
            except TargetError:
                continue
        object.__setattr__(self, "_listed", listed)

    def listed_exactly(self, target: str) -> str | None:
        """The URL the config lists for ``target`` in any spelling (``127.2`` is ``127.0.0.2``), or None."""
        try:
            return self._listed.get(canonical_url(target))
        except TargetError:
            return None

    def allows(self, target: str) -> bool:
        return not self.allow_targets or target.rstrip("/") in self._allowed

    def module_for(self, target: str) -> str | None:
        """The module ``targets:`` sets for this URL; None: not in ``targets:`` (any module)."""
        settings = self._settings.get(target.rstrip("/"))
        return settings.module if settings else None

    def options_for(self, target: str, probe: str | None = None) -> Options:
        """The API key and probe kind for one target URL; ``probe`` (a query's) may only narrow it.

        A key goes only where the config lists: the target's own to its exact URL in
        ``targets:``, the default to URLs in ``allow_targets`` (``exporter_config`` refuses a
        default key without them)."""
        target = target.rstrip("/")
        settings = self._settings.get(target)
        if settings and settings.api_key:
            api_key = settings.api_key
        else:
            api_key = self.api_key if target in self._allowed else None
        configured = settings.probe if settings else PROBE_AUTO
        return Options(api_key=api_key, probe=narrowed_probe(configured, probe),
                       stall_window=settings.stall_window if settings else None)


def narrowed_probe(configured: str, asked: str | None) -> str:
    """The probe kind when the config says ``configured`` and a query asks ``asked``: a query may
    turn the probe off or pick one of what ``auto`` may send, never turn on what the config did
    not (``none`` stays none, ``embedding`` stays embedding)."""
    if asked is None or asked == configured or configured == PROBE_NONE:
        return configured
    if asked == PROBE_NONE or configured == PROBE_AUTO:
        return asked
    return configured


def _target(raw: Any, path: str) -> TargetOptions:
    return target_options(mapping(raw, path, TARGET_KEYS, required={"url"}), path, url_with_path=True)


def _count(data, key: str, default: int, low: int, high: int, parent: str = "") -> int:
    if key not in data:
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{parent}{key}: expected a whole number from {low} to {high}, got {show(value)}")
    return value


FORENSICS_KEYS = {"enabled", "deadline", "locals", "native", "py_spy", "min_interval", "max_processes",
                  "max_concurrent", "max_output_bytes", "token_file", "pins"}
PIN_KEYS = {"url", "pid_file", "cgroup", "container"}


def forensics_settings(raw: Any) -> ForensicsSettings:
    data = mapping(raw, "forensics", FORENSICS_KEYS)
    defaults = ForensicsSettings()
    raw_pins = data.get("pins", [])
    if not isinstance(raw_pins, list):
        raise ConfigError("forensics.pins: expected a list of {url, pid_file | cgroup | container}")
    return ForensicsSettings(
        enabled=boolean(data["enabled"], "forensics.enabled") if "enabled" in data else defaults.enabled,
        deadline=optional_duration(data, "deadline", "forensics", defaults.deadline, 0.1, 300),
        locals=boolean(data["locals"], "forensics.locals") if "locals" in data else defaults.locals,
        native=boolean(data["native"], "forensics.native") if "native" in data else defaults.native,
        py_spy=string(data["py_spy"], "forensics.py_spy") if "py_spy" in data else None,
        min_interval=optional_duration(data, "min_interval", "forensics", defaults.min_interval, 0, 86400),
        max_processes=_count(data, "max_processes", defaults.max_processes, 1, 4096, "forensics."),
        max_concurrent=_count(data, "max_concurrent", defaults.max_concurrent, 1, 64, "forensics."),
        max_output_bytes=_count(data, "max_output_bytes", defaults.max_output_bytes, 4096, 1 << 30, "forensics."),
        token=secret_file(data["token_file"], "forensics.token_file") if "token_file" in data else None,
        pins=tuple(_pin(p, f"forensics.pins[{i}]") for i, p in enumerate(raw_pins)))


def _pin(raw: Any, path: str) -> tuple[str, Pin]:
    data = mapping(raw, path, PIN_KEYS, required={"url"})
    ways = [key for key in ("pid_file", "cgroup", "container") if key in data]
    if len(ways) != 1:
        raise ConfigError(f"{path}: exactly one of pid_file, cgroup, container is required")
    value = string(data[ways[0]], f"{path}.{ways[0]}")
    if ways[0] == "container" and not CONTAINER_ID.fullmatch(value):
        raise ConfigError(f"{path}.container: expected a Docker container ID (12 to 64 hex digits)")
    try:
        url = canonical_url(string(data["url"], f"{path}.url"))
    except TargetError as exc:
        raise ConfigError(f"{path}.url: the URL {exc}") from None
    return url, Pin(**{ways[0]: value})


def check_forensics(config: ExporterConfig) -> None:
    """Forensics ptraces what it finds: only for targets the config lists exactly, never any URL."""
    settings = config.forensics
    if not settings.enabled:
        return
    if config.allow_any_target:
        raise ConfigError("forensics.enabled: cannot be on with allow_any_target (a caller could aim the capture "
                          "at any address); list the backends in allow_targets or targets")
    if not config.allow_targets and not config.targets:
        raise ConfigError("forensics.enabled: needs the exact backends in allow_targets or targets (without them "
                          "any URL a client names would be captured)")
    for i, (url, _) in enumerate(settings.pins):
        if config.listed_exactly(url) is None:
            raise ConfigError(f"forensics.pins[{i}].url: not in allow_targets or targets")


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
        raise ConfigError("targets: expected a list of {url, api_key_file, probe, module, stall_window}")
    settings = tuple(_target(t, f"targets[{i}]") for i, t in enumerate(settings))
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
    allow_targets = tuple(http_url(t, f"allow_targets[{i}]", allow_path=True) for i, t in enumerate(targets))
    api_key = secret_file(data["api_key_file"], "api_key_file") if "api_key_file" in data else None
    if api_key is not None and not allow_targets:
        raise ConfigError("api_key_file: a default API key needs allow_targets (the URLs it may be sent to); "
                          "without them any URL a client names would get it. List the backends in "
                          "allow_targets, or give each its own key in targets[].api_key_file")
    config = ExporterConfig(
        timeout=timeout,
        timeout_offset=offset,
        allow_targets=allow_targets,
        allow_any_target=boolean(data["allow_any_target"], "allow_any_target")
        if "allow_any_target" in data else defaults.allow_any_target,
        max_concurrent_probes=_count(data, "max_concurrent_probes", defaults.max_concurrent_probes, 1, 4096),
        max_connections=_count(data, "max_connections", defaults.max_connections, 16, 1_000_000),
        read_timeout=read_timeout,
        api_key=api_key,
        targets=settings,
        liveness_interval=interval,
        liveness_timeout=check_timeout,
        liveness_budget=budget,
        forensics=forensics_settings(data.get("forensics")),
        startup_deadline=liveness.startup_deadline(data["startup_deadline"]) if "startup_deadline" in data else None,
    )
    check_forensics(config)
    return config


def load_exporter_config(path: str | None) -> ExporterConfig:
    return ExporterConfig() if path is None else exporter_config(load_yaml(path))
