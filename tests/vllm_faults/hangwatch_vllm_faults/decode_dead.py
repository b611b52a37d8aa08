"""Fault (a): decode never scheduled while new prompts are still prefilled.

Every request's prompt is computed (prefill runs, KV fills, prefix-cache queries count), but
no token ever comes out, so no request is ever scheduled for decode and none finishes except
by its client's abort (``finished_reason="abort"``), which frees its slot for the next
prompt. The shape of vLLM #45094 (a tensor-parallel collective wedged in decode).
"""
from __future__ import annotations

from . import _tokens


def install() -> None:
    _tokens.install(lambda request: True)
