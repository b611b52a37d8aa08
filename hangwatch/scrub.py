"""Secrets out of everything hangwatch keeps or prints: command lines, log tails, captures.

A capture and an incident record hold what a server said and ran with; vLLM logs its API key
at start-up in some versions, a launcher passes ``--api-key k1 k2`` or a JSON config, a URL
carries ``user:pass@``. One table of secret shapes, applied to every string, plus every
literal secret the caller knows (the API keys and tokens in its config). What is removed
becomes ``<redacted>``; the shape's prefix (``Bearer ``, ``hf_``) stays so a reader knows
what was there.
"""
from __future__ import annotations

import re
from typing import Iterable

REDACTED = "<redacted>"
# A name is secret-named when one of its parts (split at anything not a letter or digit) ends in one
# of these, or is one of the exact words. By parts, not substrings: ``max_num_batched_tokens`` and
# ``prompt_tokens`` are counts an LLM server logs everywhere (plural "tokens" is never a credential
# here), ``author`` and ``monkeypatch`` are not secrets; ``hf_token``, ``apiKey``, ``x-api-key``,
# ``accesstoken`` and ``--api-key`` are.
SECRET_ENDINGS = ("key", "keys", "token", "secret", "secrets", "password", "passwd", "credential",
                  "credentials", "cookie", "cookies")
SECRET_EXACT = {"auth", "authorization", "session", "sessionid", "pwd"}
SECRET_WORDS = SECRET_ENDINGS + tuple(sorted(SECRET_EXACT))
# A secret-named name in text: its last part ends in one of the endings, or is one of the exact words
# (what ``secret_named`` says of that part), starting where a name can start.
_SECRET_NAME = (r"(?<![\w.-])(?:[\w.-]*[_.-])?(?:[a-z0-9]*(?:" + "|".join(SECRET_ENDINGS) + ")|(?:"
                + "|".join(sorted(SECRET_EXACT)) + "))")

# (name, pattern, replacement): the one table of what a secret looks like in text.
SHAPES: tuple[tuple[str, re.Pattern, str], ...] = (
    ("url credentials", re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@'\"]+@"), r"\1" + REDACTED + "@"),
    ("bearer or basic credentials", re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{6,}"),
     r"\1\2" + REDACTED),
    ("json value under a secret-named key",
     re.compile(r"(?i)([\"']?" + _SECRET_NAME + r"[\"']?\s*[:=]\s*)(\[[^\]]*\]|\"[^\"]*\"|'[^']*'|[^\s,}\]]+)"),
     r"\1" + REDACTED),
    ("token prefixes", re.compile(r"\b(sk-|sk-proj-|hf_|ghp_|gho_|ghs_|github_pat_|xox[abpr]-|glpat-|AKIA)"
                                  r"[A-Za-z0-9_-]{8,}"), r"\1" + REDACTED),
)


def scrub_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without the literal ``secrets`` and without anything shaped like one."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    for _, pattern, replacement in SHAPES:
        text = pattern.sub(replacement, text)
    return text


def scrub(value, secrets: Iterable[str] = ()):
    """Every string in a JSON-shaped ``value`` scrubbed (keys named like secrets lose their values)."""
    secrets = [s for s in secrets if s]
    if isinstance(value, str):
        return scrub_text(value, secrets)
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(scrub(v, secrets) for v in value)
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(v, str) and secret_named(str(k)) else scrub(v, secrets))
                for k, v in value.items()}
    return value


def secret_named(name: str) -> bool:
    return any(part.endswith(SECRET_ENDINGS) or part in SECRET_EXACT
               for part in re.split(r"[^a-z0-9]+", name.lower()) if part)


def redact_argv(argv: Iterable[str]) -> tuple[str, ...]:
    """A command line without secrets: every value after a secret-named flag (``--api-key k1 k2``,
    up to the next flag), ``--hf-token=K``, and the text shapes of ``scrub_text`` in any argument."""
    out: list[str] = []
    hiding = False
    for arg in argv:
        if arg.startswith("-") and len(arg) > 1:
            flag, eq, _ = arg.partition("=")
            hiding = secret_named(flag)
            if hiding and eq:
                out.append(f"{flag}={REDACTED}")
                hiding = False
                continue
            out.append(scrub_text(arg))
            continue
        out.append(REDACTED if hiding else scrub_text(arg))
    return tuple(out)
