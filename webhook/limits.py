"""Fleet-wide limits: a shared incident must not become a fleet-wide restart storm.

A driver fault or a bad deploy can hang every replica of a model at once, and each target's own
cooldown and budget would let all of them restart together, leaving the model serving nothing. So at
most ``group_limit`` targets of a ``group`` are *restarting* at once (from the recorded restart until
the backend is seen healthy or ``recovery`` passes) and at most ``fleet_budget`` restarts happen across
the fleet per window; what exceeds them is left to people (docs/fleets.md). Both are computed from the
shared ledger and checked with the restart's record under ``statedir.fleet_lock``, so they hold across
replicas.
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
