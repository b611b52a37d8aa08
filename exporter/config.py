"""The exporter's YAML config, validated into a frozen dataclass before any port is bound.

Also the small shared pieces every hangwatch config needs: durations like ``10s``/``15m``,
rejection of unknown keys, and errors that name the key's path (``allow_targets[2]: ...``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

import yaml


class ConfigError(ValueError):
    """A config mistake; the message starts with the key's path."""


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def duration(value: Any, where: str) -> float:
    """Seconds from ``10s``, ``1.5m``, ``500ms``, ``2h`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration like 10s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match:
            raise ConfigError(f"{where}: expected a duration like 10s, 15m or 1h, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 0 <= seconds < 10 ** 7:
        raise ConfigError(f"{where}: duration out of range: {value!r}")
    return seconds


def mapping(value: Any, where: str, allowed: set[str], required: set[str] = frozenset()) -> Mapping:
    """``value`` as a mapping with only ``allowed`` keys and every ``required`` one."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(value).__name__}")
    prefix = f"{where}." if where else ""
    for key in value:
        if key not in allowed:
            raise ConfigError(f"{prefix}{key}: unknown key (known: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in value:
            raise ConfigError(f"{prefix}{key}: required")
    return value


def http_url(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected an http(s) URL, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: expected an http(s) URL, got {value!r}")
    return value.rstrip("/")


def load_yaml(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


@dataclass(frozen=True)
class ExporterConfig:
    timeout: float = 10.0           # budget per scrape when Prometheus does not send one
    timeout_offset: float = 0.5     # subtracted from Prometheus' scrape timeout
    allow_targets: tuple[str, ...] = ()  # empty: any target (listen on loopback then!)

    def allows(self, target: str) -> bool:
        return not self.allow_targets or target.rstrip("/") in self.allow_targets


def exporter_config(data: Any) -> ExporterConfig:
    data = mapping(data, "", {"timeout", "timeout_offset", "allow_targets"})
    defaults = ExporterConfig()
    timeout = duration(data.get("timeout", defaults.timeout), "timeout")
    if timeout <= 0:
        raise ConfigError("timeout: must be positive")
    targets = data.get("allow_targets", [])
    if not isinstance(targets, list):
        raise ConfigError("allow_targets: expected a list of URLs")
    return ExporterConfig(
        timeout=timeout,
        timeout_offset=duration(data.get("timeout_offset", defaults.timeout_offset), "timeout_offset"),
        allow_targets=tuple(http_url(t, f"allow_targets[{i}]") for i, t in enumerate(targets)),
    )


def load_exporter_config(path: str | None) -> ExporterConfig:
    return ExporterConfig() if path is None else exporter_config(load_yaml(path))
