"""Fault (c): one request never finishes while the others do.

The request asking for exactly ``STUCK_MAX_TOKENS`` tokens gets no token after its prompt:
it stays running and holds its slot forever; every other request is served normally.
"""
from __future__ import annotations

from . import _tokens

STUCK_MAX_TOKENS = 4242


def install() -> None:
    _tokens.install(lambda request: getattr(request, "max_tokens", None) == STUCK_MAX_TOKENS
                    or getattr(getattr(request, "sampling_params", None), "max_tokens", None) == STUCK_MAX_TOKENS)
