"""Drop the tokens the model samples for chosen requests, in EngineCore's scheduler.

A request whose sampled tokens are dropped never gets its next token: once its prompt is
computed, the scheduler has nothing left to schedule for it (``num_new_tokens == 0``) and skips
it at every step. It stays running, holds its KV blocks, gives no output and never finishes,
until its client gives up and aborts it. Faults decide which requests (``install(choose)``).
vLLM on the CPU schedules synchronously (``async_scheduling`` is off), so no output placeholder
is left behind.
"""
from __future__ import annotations


def install(choose) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._update_request_with_output

    def update_request_with_output(self, request, new_token_ids, is_stale=False):
        if new_token_ids and choose(request):
            return [], False
        return original(self, request, new_token_ids, is_stale)

    Scheduler._update_request_with_output = update_request_with_output
