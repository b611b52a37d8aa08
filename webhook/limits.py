"""Fleet-wide limits: a shared incident must not become a fleet-wide restart storm.

A driver fault or a bad deploy can hang every replica of a model at once. Each replica's
alert is true, each re-check says hung, and each target's cooldown and budget allow one
restart: without a limit across targets, every replica restarts together and the model
serves nothing while all of them reload. Two limits stop that; what exceeds them is left to
people (a decision of its own, counted and logged at ERROR):

``group_limit`` (reason ``group_limit``)
    Targets that serve one model share a ``group`` (a key of the target in the config, never
    an alert label: a label is whatever the sender wrote). At most ``group_limit`` targets of
    one group are *restarting* at once: a whole number, or a share of the group's targets
    (``25%``: rounded down, but never below one, so every group can heal one target).

    A target is **restarting** from the moment its restart is recorded (before the Docker
    call) until the webhook has seen its backend healthy again — its own check, the verdict
    core's, says ``idle`` or ``busy`` (a ``recovered`` ledger line) — or until ``recovery``
    has passed since the restart, whichever comes first. A restart whose backend never comes
    back holds its group's slot for the whole ``recovery``: in a shared incident the first
    restart that does not help keeps the others from being restarted for that long.

``fleet_budget`` (reason ``fleet_limit``)
    At most ``fleet_budget.restarts`` restart attempts across every target and host within
    any ``fleet_budget.window`` (a sliding window; an operator's circuit reset does not
    refund it).

Both are computed from the ledger, the memory every replica shares, and checked and recorded
as one step under ``ledger.fleet_lock``, so they hold across replicas sharing a state_dir.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone

from .config import Config, Target
from .ledger import Ledger

GROUP_LIMIT, FLEET_LIMIT = "group_limit", "fleet_limit"
LIMIT_LABELS = {GROUP_LIMIT: "group", FLEET_LIMIT: "fleet"}


def allowance(limit: int | str, size: int) -> int:
    """How many of a group of ``size`` targets may be restarting at once."""
    if isinstance(limit, str):
        return max(1, math.floor(size * float(limit.rstrip("%")) / 100 + 1e-9))
    return limit


def members(config: Config, group: str) -> list[Target]:
    return [t for t in config.targets if t.group == group]


def restarting(config: Config, ledger: Ledger, group: str, now: float) -> list[str]:
    """The group's targets whose last restart is unsettled (see the module docstring)."""
    return [t.name for t in members(config, group) if ledger.restarting(t.name, now, config.recovery)]


def withheld(config: Config, ledger: Ledger, target: Target, now: float) -> tuple[str, str] | None:
    """``(reason, detail)`` if restarting ``target`` now would exceed a fleet-wide limit, else None.
    The caller holds the fleet lock and has just refreshed the ledger."""
    if target.group is not None:
        group = members(config, target.group)
        allowed = allowance(config.group_limit, len(group))
        others = [name for name in restarting(config, ledger, target.group, now) if name != target.name]
        if len(others) >= allowed:
            return GROUP_LIMIT, (
                f"group {target.group}: {len(others)} of its {len(group)} targets restarting "
                f"({', '.join(others)}); group_limit {config.group_limit} allows {allowed} at once (a restart "
                f"counts until its backend answers idle or busy again, at most recovery {config.recovery:g}s)")
    budget = config.fleet_budget
    recent = ledger.restarts_since(now - budget.window)
    if len(recent) >= budget.restarts:
        frees = datetime.fromtimestamp(recent[0][0] + budget.window, timezone.utc).isoformat().replace("+00:00", "Z")
        return FLEET_LIMIT, (f"{len(recent)} restarts across the fleet within {budget.window:g}s "
                             f"(fleet_budget {budget.restarts}); the next is allowed after {frees}")
    return None
