"""The webhook's YAML config → frozen dataclasses, checked completely before anything starts.

A restarter that acts on a typo is worse than none, so every key is known, every value is
typed and ranged, and every error names its path (``targets[1].contanier: unknown key``).
``main()`` turns a ``ConfigError`` into one line on stderr and a non-zero exit before the
port is bound. The keys and defaults are DESIGN.md's "The webhook".
"""
from __future__ import annotations

from exporter.modules import NEVER_RESTARTED, OBSERVERS

import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import yaml

TOKEN_ENV = "HANGWATCH_WEBHOOK_TOKEN"
# module -> may it ever be restarted?  A proxy or a FastChat front serves many backends:
# restart those instead. The list is exporter/modules.py's, so a new module is known here too.
MODULES = {name: name not in NEVER_RESTARTED for name in OBSERVERS}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # also used in lock file names
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # Docker's own name rule


class ConfigError(ValueError):
    """One bad key; the message starts with its path."""


@dataclass(frozen=True)
class Recheck:
    interval: float = 10.0
    timeout: float = 5.0


@dataclass(frozen=True)
class Budget:
    restarts: int = 3
    window: float = 3600.0


@dataclass(frozen=True)
class Target:
    name: str
    container: str
    url: str
    module: str = "backend"
    stop_timeout: float = 30.0


@dataclass(frozen=True)
class Config:
    targets: tuple[Target, ...]
    token_file: str | None = None
    state_dir: str = "/var/lib/hangwatch"
    dry_run: bool = False
    alertnames: tuple[str, ...] = ("HangwatchBackendHung",)
    recheck: Recheck = field(default_factory=Recheck)
    cooldown: float = 900.0
    budget: Budget = field(default_factory=Budget)

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)


def parse_duration(value, path: str) -> float:
    """``10s``, ``15m``, ``1h``, ``500ms`` → seconds. A bare number is refused: 15 what?"""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ConfigError(f"{path}: expected a duration like 10s, 15m or 1h, got {_show(value)}")
    match = _DURATION.match(value)
    if not match:
        raise ConfigError(f"{path}: {value!r} is not a duration (use e.g. 10s, 15m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def load_config(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where else ""
        raise ConfigError(f"{path}: not valid YAML{line}") from None
    return parse_config(raw)


def parse_config(raw) -> Config:
    top = _mapping(raw, "config", {"token_file", "state_dir", "dry_run", "alertnames", "recheck",
                                   "cooldown", "budget", "targets"})
    defaults = Config(targets=())
    token_file = top.get("token_file")
    if token_file is not None:
        token_file = _string(token_file, "token_file")
    state_dir = _string(top.get("state_dir", defaults.state_dir), "state_dir")
    dry_run = top.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"dry_run: expected true or false, got {_show(dry_run)}")
    alertnames = top.get("alertnames", list(defaults.alertnames))
    if not isinstance(alertnames, list) or not alertnames:
        raise ConfigError("alertnames: expected a non-empty list of alert names")
    alertnames = tuple(_string(a, f"alertnames[{i}]") for i, a in enumerate(alertnames))

    recheck_raw = _mapping(top.get("recheck", {}), "recheck", {"interval", "timeout"})
    recheck = Recheck(
        interval=_ranged(recheck_raw, "interval", "recheck", Recheck.interval, 0.1, 600),
        timeout=_ranged(recheck_raw, "timeout", "recheck", Recheck.timeout, 0.1, 600))
    cooldown = _ranged(top, "cooldown", "", defaults.cooldown, 0, 7 * 86400)
    budget_raw = _mapping(top.get("budget", {}), "budget", {"restarts", "window"})
    restarts = budget_raw.get("restarts", Budget.restarts)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or not 1 <= restarts <= 1000:
        raise ConfigError(f"budget.restarts: expected a whole number from 1 to 1000, got {_show(restarts)}")
    budget = Budget(restarts, _ranged(budget_raw, "window", "budget", Budget.window, 1, 30 * 86400))

    targets_raw = top.get("targets")
    if not isinstance(targets_raw, list) or not targets_raw:
        raise ConfigError("targets: required, a non-empty list (the only containers ever restarted)")
    targets = tuple(_target(t, f"targets[{i}]") for i, t in enumerate(targets_raw))
    for key in ("name", "container"):
        seen = {}
        for i, target in enumerate(targets):
            value = getattr(target, key)
            if value in seen:
                raise ConfigError(f"targets[{i}].{key}: {value!r} is already used by targets[{seen[value]}]")
            seen[value] = i
    return Config(targets=targets, token_file=token_file, state_dir=state_dir, dry_run=dry_run,
                  alertnames=alertnames, recheck=recheck, cooldown=cooldown, budget=budget)


def load_token(config: Config, env=os.environ) -> str:
    """The bearer token: ``token_file`` if configured, else ``$HANGWATCH_WEBHOOK_TOKEN``."""
    if config.token_file:
        try:
            with open(config.token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise ConfigError(f"token_file: cannot read {config.token_file}: {exc.strerror or exc}") from None
        where = "token_file: the file"
    else:
        token = env.get(TOKEN_ENV, "").strip()
        where = f"token_file: not set, and ${TOKEN_ENV}"
    if not token:
        raise ConfigError(f"{where} is empty (a bearer token is required)")
    if any(c.isspace() for c in token) or not token.isprintable() or not token.isascii():
        raise ConfigError(f"{where.split(':')[0]}: the token must be printable ASCII without spaces")
    return token


def _target(raw, path: str) -> Target:
    data = _mapping(raw, path, {"name", "container", "url", "module", "stop_timeout"})
    for key in ("name", "container", "url"):
        if key not in data:
            raise ConfigError(f"{path}.{key}: required")
    name = _string(data["name"], f"{path}.name")
    if not _NAME.match(name):
        raise ConfigError(f"{path}.name: {name!r} must be letters, digits, '_', '.', '-' (at most 63)")
    container = _string(data["container"], f"{path}.container")
    if not _CONTAINER.match(container):
        raise ConfigError(f"{path}.container: {container!r} is not a Docker container name")
    url = _url(data["url"], f"{path}.url")
    module = data.get("module", "backend")
    if module not in MODULES:
        raise ConfigError(f"{path}.module: {_show(module)} is not one of {', '.join(sorted(MODULES))}")
    if not MODULES[module]:
        raise ConfigError(f"{path}.module: a {module} is never restarted (it fronts many backends); "
                          "list its backends as targets instead")
    stop_timeout = _ranged(data, "stop_timeout", path, Target.stop_timeout, 0, 600)
    return Target(name=name, container=container, url=url, module=module, stop_timeout=stop_timeout)


def _url(value, path: str) -> str:
    text = _string(value, path)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ConfigError(f"{path}: {text!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{path}: {text!r} must be http(s)://HOST[:PORT]")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(f"{path}: {text!r} must not carry credentials, a query or a fragment")
    if port == 0:
        raise ConfigError(f"{path}: port 0 is not a port")
    return text.rstrip("/")


def _mapping(raw, path: str, allowed: set[str]) -> dict:
    if raw is None and path != "config":
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping, got {_show(raw)}")
    prefix = "" if path == "config" else f"{path}."
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{prefix}{key}: unknown key (known: {', '.join(sorted(allowed))})")
    return raw


def _string(value, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: expected a non-empty string, got {_show(value)}")
    return value


def _ranged(data: dict, key: str, parent: str, default: float, low: float, high: float) -> float:
    path = f"{parent}.{key}" if parent else key
    if key not in data:
        return default
    seconds = parse_duration(data[key], path)
    if not low <= seconds <= high:
        raise ConfigError(f"{path}: {data[key]} is out of range ({_human(low)} to {_human(high)})")
    return seconds


def _human(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
