"""Secret files the webhook reads must not be open to every user on the machine.

The alert token, the reset token, a backend's API key and a Docker TLS key each let their
holder do what the webhook does (have a container restarted, talk to a Docker host as it), so a
file any local user may read, or rewrite, is refused at start-up (exit 64, naming its key)
rather than warned about. Group-readable is fine: in compose, Alertmanager reads the token
through the webhook's group (the file is 0440).
"""
from __future__ import annotations

import os
import stat

from hangwatch.settings import ConfigError


def require_private(path: str, key: str, advice: str = "chmod 0600, or 0640/0440 to share it with a group") -> None:
    """ConfigError naming ``key`` when others (not the owner or group) may read or write ``path``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # reading it has already said why it cannot be used
        return
    if mode & 0o006:
        raise ConfigError(f"{key}: {path} is readable or writable by others (mode {stat.S_IMODE(mode):04o}); {advice}")
