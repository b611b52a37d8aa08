"""Fault (b): admission that never admits.

Every waiting request is reported blocked, so the scheduler skips it at every step and marks
it deferred (``vllm:num_requests_waiting_by_reason{reason="deferred"}``), as a KV transfer that
never completes would: requests wait, none is admitted, the ones already running finish. The
shape of vLLM #53130 (admission livelock: deferred requests, nothing finished for hours).
"""
from __future__ import annotations


def install() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    Scheduler._handle_blocked_waiting_request = lambda self, request: False
