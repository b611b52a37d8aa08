"""The webhook's YAML config → frozen dataclasses, checked completely before anything starts.

A restarter that acts on a typo is worse than none, so every key is known, every value is
typed and ranged, and every error names its path (``targets[1].contanier: unknown key``).
``main()`` turns a ``ConfigError`` into one line on stderr and a non-zero exit before the
port is bound. The keys and defaults are DESIGN.md's "The webhook".
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from hangwatch.modules import MODULES as MODULE_TABLE
from hangwatch.observation import PROBE_AUTO, PROBE_KINDS
from hangwatch.settings import (ConfigError, boolean, http_url, load_yaml, loose_permissions, mapping,
                                optional_duration, secret_file, show, string, string_list)

log = logging.getLogger("hangwatch.webhook")

TOKEN_ENV = "HANGWATCH_WEBHOOK_TOKEN"
MIN_TOKEN_CHARS = 32  # secrets.token_urlsafe(32) gives 43; a short token can be guessed
# module -> may it ever be restarted?  A proxy or a FastChat front serves many backends:
# restart those instead. The table is hangwatch/modules.py's, so a new module is known here too.
MODULES = {name: row.restartable for name, row in MODULE_TABLE.items()}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # also used in lock file names
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # Docker's own name rule


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
    api_key: str | None = field(default=None, repr=False)  # api_key_file's contents: never printed
    probe: str = PROBE_AUTO


@dataclass(frozen=True)
class Config:
    targets: tuple[Target, ...]
    token_file: str | None = None
    reset_token_file: str | None = None
    state_dir: str = "/var/lib/hangwatch"
    dry_run: bool = False
    alertnames: tuple[str, ...] = ("HangwatchBackendHung",)
    recheck: Recheck = field(default_factory=Recheck)
    cooldown: float = 900.0
    budget: Budget = field(default_factory=Budget)

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)


def load_config(path: str) -> Config:
    return parse_config(load_yaml(path))


def parse_config(raw) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a mapping, got {show(raw)}")
    top = mapping(raw, "", {"token_file", "reset_token_file", "state_dir", "dry_run", "alertnames", "recheck",
                            "cooldown", "budget", "targets"})
    defaults = Config(targets=())
    token_file = top.get("token_file")
    if token_file is not None:
        token_file = string(token_file, "token_file")
    reset_token_file = top.get("reset_token_file")
    if reset_token_file is not None:
        reset_token_file = string(reset_token_file, "reset_token_file")
    state_dir = string(top.get("state_dir", defaults.state_dir), "state_dir")
    dry_run = boolean(top.get("dry_run", False), "dry_run")
    alertnames = top.get("alertnames", list(defaults.alertnames))
    if not isinstance(alertnames, list) or not alertnames:
        raise ConfigError("alertnames: expected a non-empty list of alert names")
    alertnames = string_list(alertnames, "alertnames", non_empty=True)

    recheck_raw = mapping(top.get("recheck"), "recheck", {"interval", "timeout"})
    recheck = Recheck(
        interval=optional_duration(recheck_raw, "interval", "recheck", Recheck.interval, 0.1, 600),
        timeout=optional_duration(recheck_raw, "timeout", "recheck", Recheck.timeout, 0.1, 600))
    cooldown = optional_duration(top, "cooldown", "", defaults.cooldown, 0, 7 * 86400)
    budget_raw = mapping(top.get("budget"), "budget", {"restarts", "window"})
    restarts = budget_raw.get("restarts", Budget.restarts)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or not 1 <= restarts <= 1000:
        raise ConfigError(f"budget.restarts: expected a whole number from 1 to 1000, got {show(restarts)}")
    budget = Budget(restarts, optional_duration(budget_raw, "window", "budget", Budget.window, 1, 30 * 86400))

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
    return Config(targets=targets, token_file=token_file, reset_token_file=reset_token_file,
                  state_dir=state_dir, dry_run=dry_run, alertnames=alertnames, recheck=recheck,
                  cooldown=cooldown, budget=budget)


def load_token(config: Config, env=os.environ) -> str:
    """The bearer token Alertmanager sends: ``token_file`` if configured, else ``$HANGWATCH_WEBHOOK_TOKEN``."""
    if config.token_file:
        return _token_from_file(config.token_file, "token_file")
    token = env.get(TOKEN_ENV, "").strip()
    where = f"token_file: not set, and ${TOKEN_ENV}"
    if not token:
        raise ConfigError(f"{where} is empty (a bearer token is required)")
    if any(c.isspace() for c in token) or not token.isprintable() or not token.isascii():
        raise ConfigError(f"{where} must be printable ASCII without spaces")
    return _long_enough(token, where)


def load_reset_token(config: Config, token: str) -> str | None:
    """The operator's token for ``POST /circuit/<target>/reset`` (``reset_token_file``), or None:
    then the alert token resets circuits too."""
    if not config.reset_token_file:
        return None
    reset_token = _token_from_file(config.reset_token_file, "reset_token_file")
    if reset_token == token:
        raise ConfigError("reset_token_file: holds the same token as token_file; a separate reset token must differ")
    return reset_token


def _token_from_file(path: str, key: str) -> str:
    token = _long_enough(secret_file(path, key), f"{key}: the token in {path}")
    if loose_permissions(path):
        log.warning("%s: %s is readable or writable by others; make it readable by the webhook's user "
                    "(and group) only, e.g. chmod 0640 or 0440", key, path)
    return token


def _long_enough(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where} is {len(token)} characters; at least {MIN_TOKEN_CHARS} are required "
                          "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def _target(raw, path: str) -> Target:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping, got {show(raw)}")
    data = mapping(raw, path, {"name", "container", "url", "module", "stop_timeout", "api_key_file", "probe"},
                   required={"name", "container", "url"})
    name = string(data["name"], f"{path}.name")
    if not _NAME.match(name):
        raise ConfigError(f"{path}.name: {name!r} must be letters, digits, '_', '.', '-' (at most 63)")
    container = string(data["container"], f"{path}.container")
    if not _CONTAINER.match(container):
        raise ConfigError(f"{path}.container: {container!r} is not a Docker container name")
    url = http_url(data["url"], f"{path}.url")
    module = data.get("module", "backend")
    if module not in MODULES:
        raise ConfigError(f"{path}.module: {show(module)} is not one of {', '.join(sorted(MODULES))}")
    if not MODULES[module]:
        raise ConfigError(f"{path}.module: a {module} is never restarted (it fronts many backends); "
                          "list its backends as targets instead")
    stop_timeout = optional_duration(data, "stop_timeout", path, Target.stop_timeout, 0, 600)
    api_key = secret_file(data["api_key_file"], f"{path}.api_key_file") if "api_key_file" in data else None
    probe = data.get("probe", PROBE_AUTO)
    if probe not in PROBE_KINDS:
        raise ConfigError(f"{path}.probe: {show(probe)} is not one of {', '.join(PROBE_KINDS)}")
    return Target(name=name, container=container, url=url, module=module, stop_timeout=stop_timeout,
                  api_key=api_key, probe=probe)
