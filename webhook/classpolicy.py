"""The config keys that say how a proved hang is treated: ``targets[].policy`` and
``targets[].startup_deadline``, validated at start-up (exit 64 naming the key).

A leaf that ``config.py`` reads: ``wrongtool.py``, which applies them, needs the decisions and so
the config, and parsing them there made config → wrongtool → decisions → config a circle.
"""
from __future__ import annotations

from hangwatch.forensics.logsignatures import CLASSES, POLICIES
from hangwatch.settings import ConfigError, mapping, optional_duration, show


def class_policies(raw, path: str) -> tuple[tuple[str, str], ...] | None:
    """``targets[].policy``: {class: restart | alert_only} for any of the catalogue's classes."""
    if raw is None:
        return None
    data = mapping(raw, path, set(CLASSES))
    for klass, policy in data.items():
        if policy not in POLICIES:
            raise ConfigError(f"{path}.{klass}: expected one of {', '.join(POLICIES)}, got {show(policy)}")
    return tuple(sorted(data.items()))


def startup_deadline(data: dict, path: str) -> float | None:
    """``targets[].startup_deadline``: how long a container may be up with its port closed."""
    if "startup_deadline" not in data:
        return None
    return optional_duration(data, "startup_deadline", path, 0.0, 1, 7 * 86400)
