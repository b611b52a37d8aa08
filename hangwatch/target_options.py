"""How one target is read, as a config sets it: the part the exporter's and the webhook's targets share.

Both faces read the same backends the same way (a URL, a module, the backend's own API key, the
idle probe's kind, a stall window), so one type and one validator serve both; each face adds
only its own keys (the webhook's container and restart policy) and decides which of these it
accepts (``mapping`` rejects the rest, naming the key).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .modules import MODULES
from .observation import PROBE_AUTO, PROBE_KINDS
from .settings import ConfigError, duration, http_url, secret_file, show

KEYS = frozenset({"url", "module", "api_key_file", "probe", "stall_window"})


@dataclass(frozen=True)
class TargetOptions:
    url: str
    module: str = "backend"
    api_key: str | None = field(default=None, repr=False)  # api_key_file's contents: never printed
    probe: str = PROBE_AUTO
    stall_window: float | None = None  # None: the engine's default (hangwatch/engines.py)


def target_options(data: Mapping, path: str, *, url_with_path: bool) -> TargetOptions:
    """The shared keys of one ``targets[i]`` mapping (its keys already checked by the face);
    ``url_with_path``: the URL may carry a base path (the exporter's targets may)."""
    return TargetOptions(
        url=http_url(data["url"], f"{path}.url", allow_path=url_with_path),
        module=module_name(data["module"], f"{path}.module") if "module" in data else "backend",
        api_key=secret_file(data["api_key_file"], f"{path}.api_key_file") if "api_key_file" in data else None,
        probe=probe_kind(data["probe"], f"{path}.probe") if "probe" in data else PROBE_AUTO,
        stall_window=duration(data["stall_window"], f"{path}.stall_window", low=1.0, high=7 * 86400.0)
        if "stall_window" in data else None)


def module_name(value: Any, path: str) -> str:
    if value not in MODULES:
        raise ConfigError(f"{path}: {show(value)} is not one of {', '.join(sorted(MODULES))}")
    return value


def probe_kind(value: Any, path: str) -> str:
    if value not in PROBE_KINDS:
        raise ConfigError(f"{path}: {show(value)} is not one of {', '.join(PROBE_KINDS)}")
    return value
