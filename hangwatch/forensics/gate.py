"""No capture from a server that is not hung: the verdict core decides, the capture follows.

A capture reads every process of the server (and with ``--native`` pauses them), so it is
taken only from a server judged ``hung`` at that moment — never from one that is busy, idle
or loading. ``hangwatch forensics`` and the exporter's ``/forensics`` both come through here:
a check (the caller's: the ordinary one or the bounded one), then the capture.
"""
from __future__ import annotations

from typing import Callable

from .capture import capture

HUNG = "hung"


def refused(state: str | None, reason: str) -> dict:
    """The answer when nothing is captured (the seam's shape, empty)."""
    return {"verdict": state, "reason": reason, "signature": None, "captured_at": None, "processes": [],
            "errors": [f"not captured: the target is judged {state or 'nothing (no verdict in time)'}, not hung: "
                       f"{reason}"], "captured": False}


def capture_if_hung(url: str, judge: Callable[[], object], *, secrets=(), **capture_args) -> dict:
    """``judge()`` returns a CheckResult (or None: no verdict in time); a capture only if it says hung."""
    result = judge()
    verdict = getattr(result, "verdict", None)
    state, reason = (verdict.state, verdict.reason) if verdict is not None else (None, "no verdict in time")
    if state != HUNG:
        return refused(state, reason)
    return {"verdict": state, "reason": reason, "captured": True} | capture(url, secrets=secrets, **capture_args)
