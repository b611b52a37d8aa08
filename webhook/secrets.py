"""Every secret the webhook knows, so none of them lands in an incident record.

An incident keeps the container's log tail and the stacks; a server may log its API key at
start-up, a capture may hold a token in a command line. The shapes of secrets are scrubbed
everywhere (``hangwatch.scrub``); these are the literal ones besides: each target's API key,
the alert and reset tokens, the forensics token.
"""
from __future__ import annotations

from hangwatch.scrub import scrub
from hangwatch.settings import ConfigError, secret_file

from .config import Config, load_reset_token, load_token


def forensics_token(config: Config) -> str | None:
    if not config.forensics_token_file:
        return None
    try:
        return secret_file(config.forensics_token_file, "forensics_token_file")
    except ConfigError:
        return None


def known_secrets(config: Config) -> list[str]:
    found = [t.api_key for t in config.targets if t.api_key]
    try:
        token = load_token(config)
        found += [token, load_reset_token(config, token) or ""]
    except ConfigError:
        pass
    return [s for s in (*found, forensics_token(config)) if s]


def scrubbed(value, config: Config):
    """``value`` (a log tail, a capture) without any secret the webhook knows or any secret shape."""
    return scrub(value, known_secrets(config))
