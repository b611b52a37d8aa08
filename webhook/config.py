"""The webhook's YAML config → frozen dataclasses, checked completely before anything starts.

A restarter that acts on a typo is worse than none, so every key is known, every value is
typed and ranged, and every error names its path (``targets[1].contanier: unknown key``).
``main()`` turns a ``ConfigError`` into one line on stderr and a non-zero exit before the
port is bound. The keys and defaults are DESIGN.md's "The webhook"; which Docker host a target lives on
is ``hosts.py``'s, the fleet-wide limits' meaning is ``limits.py``'s.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from hangwatch.modules import MODULES
from hangwatch.settings import (
    ConfigError,
    boolean,
    http_url,
    load_yaml,
    mapping,
    optional_duration,
    secret_file,
    show,
    string,
    string_list,
)
from hangwatch.target_options import KEYS as SHARED_TARGET_KEYS
from hangwatch.target_options import TargetOptions, target_options

from .classpolicy import class_policies, startup_deadline
from .escalation import Escalate, parse_escalate
from .hosts import DEFAULT_HOST, DockerHost, parse_docker_hosts, require_tls, resolve
from .private import require_private

TOKEN_ENV = "HANGWATCH_WEBHOOK_TOKEN"
MIN_TOKEN_CHARS = 32  # secrets.token_urlsafe(32) gives 43; a short token can be guessed
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # also used in lock file names
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # Docker's own name rule
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
# A target's keys: how it is read (the core's, but stall_window: the re-check's window is its own,
# two recheck intervals) and what the webhook may do to it.
READ_KEYS = SHARED_TARGET_KEYS - {"stall_window"}
TARGET_KEYS = frozenset({"name", "container", "stop_timeout", "docker_host", "group", "insecure_tcp", "forensics_url",
                         "restart_on", "policy", "startup_deadline"})
RESERVED_NAMES = {"ledger"}  # locks/ledger.lock is the ledger's own lock: a target's lock must not be it


@dataclass(frozen=True)
class Recheck:
    interval: float = 10.0
    timeout: float = 5.0


@dataclass(frozen=True)
class Budget:
    restarts: int = 3
    window: float = 3600.0


# The verdicts a target may be restarted for (restart_on); stalled only where a target opts in.
RESTART_VERDICTS = ("hung", "stalled")
STALL_ALERT = "HangwatchBackendStalled"


@dataclass(frozen=True)
class Target:
    """A container the webhook may restart, and how its re-check reads it (``read``: the core's
    per-target options, the same type the exporter's targets have)."""

    name: str
    container: str
    read: TargetOptions
    stop_timeout: float = 30.0
    docker_host: DockerHost = DEFAULT_HOST
    group: str | None = None  # the targets that serve one model (group_limit); from the config only
    forensics_url: str | None = None  # the exporter asked for the stacks before a restart (GET /forensics)
    restart_on: tuple[str, ...] = ("hung",)  # verdicts that may restart it: hung, and stalled if opted in
    policy: tuple[tuple[str, str], ...] | None = None  # (class, restart | alert_only) overrides (wrongtool.py)
    startup_deadline: float | None = None     # up this long, port closed, log silent: startup_stuck

    @property
    def url(self) -> str:
        return self.read.url

    @property
    def module(self) -> str:
        return self.read.module

    @property
    def api_key(self) -> str | None:
        return self.read.api_key

    @property
    def probe(self) -> str:
        return self.read.probe


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
    docker_hosts: tuple[DockerHost, ...] = ()          # declared in docker_hosts (used or not)
    group_limit: int | str = 1                          # a count, or a share such as "25%"
    recovery: float = 900.0
    fleet_budget: Budget = field(default_factory=lambda: Budget(restarts=10, window=3600.0))
    forensics_timeout: float = 30.0                     # the longest a restart waits for the stacks
    forensics_token_file: str | None = None             # the exporter's forensics.token_file, sent as a bearer
    escalate: Escalate | None = None                    # once per incident a restart cannot help

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    @property
    def hosts(self) -> tuple[DockerHost, ...]:
        """Every Docker host a target lives on, each once (by name)."""
        seen: dict[str, DockerHost] = {}
        for target in self.targets:
            seen.setdefault(target.docker_host.name, target.docker_host)
        return tuple(seen.values())

    @property
    def history(self) -> float:
        """How far back the ledger must remember restarts for every limit to be computed."""
        return max(self.budget.window, self.fleet_budget.window, self.recovery)


def load_config(path: str, env=os.environ) -> Config:
    return parse_config(load_yaml(path), env)


def parse_config(raw, env=os.environ) -> Config:
    """``env``: where the default Docker host's ``DOCKER_HOST`` and ``DOCKER_TLS_VERIFY`` are read."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a mapping, got {show(raw)}")
    top = mapping(raw, "", {"token_file", "reset_token_file", "state_dir", "dry_run", "alertnames", "recheck",
                            "cooldown", "budget", "targets", "docker_hosts", "group_limit", "recovery",
                            "fleet_budget", "forensics_timeout", "forensics_token_file", "escalate"})
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
    budget = _budget(top.get("budget"), "budget", defaults.budget)
    fleet_budget = _budget(top.get("fleet_budget"), "fleet_budget", defaults.fleet_budget)
    group_limit = _group_limit(top.get("group_limit", defaults.group_limit))
    recovery = optional_duration(top, "recovery", "", defaults.recovery, 1, 7 * 86400)
    hosts = parse_docker_hosts(top.get("docker_hosts"))
    forensics_timeout = optional_duration(top, "forensics_timeout", "", defaults.forensics_timeout, 0.1, 600)
    forensics_token_file = None
    if "forensics_token_file" in top:
        forensics_token_file = string(top["forensics_token_file"], "forensics_token_file")
        secret_file(forensics_token_file, "forensics_token_file")
        require_private(forensics_token_file, "forensics_token_file")

    targets_raw = top.get("targets")
    if not isinstance(targets_raw, list) or not targets_raw:
        raise ConfigError("targets: required, a non-empty list (the only containers ever restarted)")
    targets = tuple(_target(t, f"targets[{i}]", hosts, env) for i, t in enumerate(targets_raw))
    seen: dict = {}
    for i, target in enumerate(targets):
        if target.name in seen:
            raise ConfigError(f"targets[{i}].name: {target.name!r} is already used by targets[{seen[target.name]}]")
        seen[target.name] = i
    seen = {}
    for i, target in enumerate(targets):  # one container name may live on several hosts, once on each
        key = (target.docker_host.identity, target.container)
        if key in seen:
            raise ConfigError(f"targets[{i}].container: {target.container!r} on docker host "
                              f"{target.docker_host.name!r} is already used by targets[{seen[key]}]")
        seen[key] = i
    return Config(targets=targets, token_file=token_file, reset_token_file=reset_token_file,
                  state_dir=state_dir, dry_run=dry_run, alertnames=alertnames, recheck=recheck,
                  cooldown=cooldown, budget=budget, docker_hosts=tuple(hosts.values()), group_limit=group_limit,
                  recovery=recovery, fleet_budget=fleet_budget, forensics_timeout=forensics_timeout,
                  forensics_token_file=forensics_token_file,
                  escalate=parse_escalate(top.get("escalate")))


def _budget(raw, path: str, default: Budget) -> Budget:
    data = mapping(raw, path, {"restarts", "window"})
    restarts = data.get("restarts", default.restarts)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or not 1 <= restarts <= 1000:
        raise ConfigError(f"{path}.restarts: expected a whole number from 1 to 1000, got {show(restarts)}")
    return Budget(restarts, optional_duration(data, "window", path, default.window, 1, 30 * 86400))


def _group_limit(value) -> int | str:
    """A whole number (at least 1) or a share of the group such as ``25%`` (above 0, at most 100)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 1 <= value <= 1000:
            return value
    elif isinstance(value, str) and (match := _SHARE.match(value)):
        if 0 < float(match.group(1)) <= 100:
            return f"{float(match.group(1)):g}%"
    raise ConfigError(f"group_limit: expected a whole number from 1 to 1000 or a share such as '25%' "
                      f"(above 0%, at most 100%), got {show(value)}")


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
    require_private(path, key)
    return token


def _long_enough(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where} is {len(token)} characters; at least {MIN_TOKEN_CHARS} are required "
                          "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def _target(raw, path: str, hosts: dict[str, DockerHost], env) -> Target:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping, got {show(raw)}")
    data = mapping(raw, path, READ_KEYS | TARGET_KEYS, required={"name", "container", "url"})
    name = string(data["name"], f"{path}.name")
    if not _NAME.match(name):
        raise ConfigError(f"{path}.name: {name!r} must be letters, digits, '_', '.', '-' (at most 63)")
    if name in RESERVED_NAMES:
        raise ConfigError(f"{path}.name: {name!r} is reserved (the ledger's own lock); choose another name")
    container = string(data["container"], f"{path}.container")
    if not _CONTAINER.match(container):
        raise ConfigError(f"{path}.container: {container!r} is not a Docker container name")
    read = target_options(data, path, url_with_path=False)
    module = read.module
    if not MODULES[module].restartable:  # a proxy or a FastChat front: restart its backends instead
        raise ConfigError(f"{path}.module: a {module} is never restarted (it fronts many backends); "
                          "list its backends as targets instead")
    stop_timeout = optional_duration(data, "stop_timeout", path, Target.stop_timeout, 0, 600)
    if "api_key_file" in data:
        require_private(data["api_key_file"], f"{path}.api_key_file")
    docker_host = resolve(data.get("docker_host"), f"{path}.docker_host", hosts)
    require_tls(docker_host, boolean(data.get("insecure_tcp", False), f"{path}.insecure_tcp"),
                f"{path}.docker_host", env)
    group = None
    if "group" in data:
        group = string(data["group"], f"{path}.group")
        if not _NAME.match(group):
            raise ConfigError(f"{path}.group: {group!r} must be letters, digits, '_', '.', '-' (at most 63)")
    forensics_url = http_url(data["forensics_url"], f"{path}.forensics_url") if "forensics_url" in data else None
    restart_on = tuple(string_list(data.get("restart_on", ["hung"]), f"{path}.restart_on", non_empty=True))
    for verdict in restart_on:
        if verdict not in RESTART_VERDICTS:
            raise ConfigError(f"{path}.restart_on: {show(verdict)} is not one of {', '.join(RESTART_VERDICTS)}")
    return Target(name=name, container=container, read=read, stop_timeout=stop_timeout, docker_host=docker_host,
                  group=group, forensics_url=forensics_url, restart_on=restart_on,
                  policy=class_policies(data.get("policy"), f"{path}.policy"),
                  startup_deadline=startup_deadline(data, path))
