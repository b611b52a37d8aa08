"""One check that always answers in time, and what a kubelet's two questions make of it.

A kubelet asks "is this container alive?" (restart it if not) and "may it take work?" (take
it out of its Service if not), every ``periodSeconds``, and counts a probe that does not
answer within ``timeoutSeconds`` as a failure. So the check behind both answers must be
bounded: ``bounded_check`` runs the ordinary ``check`` (same readings, same verdict, the
same "never a request while anything is in flight") but starts a reading only when it can
still finish inside the budget; when the budget runs out first, the verdict so far stands
(never ``hung``: a verdict that needed more readings was not reached).

``liveness`` says 503-worthy only for ``hung``; down (perhaps loading weights), blind, busy,
idle and restarted are all alive, so a pod loading weights or serving a long prefill is
never killed. ``readiness`` is stricter: only a backend that can take work now (idle and
answering its probe, busy with progress, restarted and answering) is ready; hung, down,
blind, asleep or a failed idle probe take it out of rotation at once.

The budget each kind of hang needs (a reading — its read and its idle probe together —
ends within ``timeout``, whatever the server does; ``interval`` between readings)::

    wedged process     reading, interval, reading                  -> 2 x timeout + interval
    failed idle probe  reading, interval, reading                  -> 2 x timeout + interval
    stalled engine     reading, interval, reading, interval, reading -> 2 x interval + timeout
                       (the last reading may take the whole timeout; the others answered)

(a reading is started only if it could still take its whole timeout), plus one timeout
for the reads that did answer (milliseconds each, but not none on a loaded machine).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .check import CheckResult, check
from .observation import Observation
from .verdict import BUSY, HUNG, IDLE, RESTARTED, STALLED, Verdict

# The defaults behind /livez, /readyz and `hangwatch check --liveness`: hung is reachable
# in one call (needed_budget(2, 2) = 8 s; the budget leaves 1 s to spare) and the answer
# comes within 9 s, so a kubelet with timeoutSeconds 10 never counts a slow answer as a failure.
INTERVAL, TIMEOUT, BUDGET = 2.0, 2.0, 9.0


def reading_seconds(module: str, timeout: float) -> float:
    """The longest one reading can take: its whole deadline (the read and any idle probe share it)."""
    return timeout


def needed_budget(interval: float, timeout: float) -> float:
    """The smallest budget in which every kind of hang can be reached in one check: the
    longest path above, plus one timeout for the readings that did answer (a /metrics read
    takes milliseconds, but not none on a loaded machine)."""
    return max(2 * timeout + interval, 2 * interval + timeout) + timeout


@dataclass(frozen=True)
class Bounded:
    """A check cut to a budget: ``complete`` is False when the budget ended it early."""
    result: CheckResult
    complete: bool
    seconds: float

    @property
    def verdict(self) -> Verdict:
        return self.result.verdict


class _OutOfBudget(Exception):
    pass


def bounded_check(url: str, *, module: str = "backend", interval: float = INTERVAL,
                  timeout: float = TIMEOUT, budget: float = BUDGET,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                  on_observation: Callable[[Observation, Verdict], None] | None = None,
                  **check_args: Any) -> Bounded:
    """``check(url, ...)``, taking a next reading only when it can finish within ``budget``.

    ``check_args`` go to ``hangwatch.check.check`` unchanged (``grace``, ``engine``,
    ``client``, and the target's own ``api_key`` / ``probe``).
    """
    started = clock()
    deadline = started + budget
    longest = reading_seconds(module, timeout)
    seen: list[tuple[Observation, Verdict]] = []

    def remember(observation: Observation, verdict: Verdict) -> None:
        seen.append((observation, verdict))
        if on_observation:
            on_observation(observation, verdict)

    def guarded_sleep(seconds: float) -> None:
        if clock() + seconds + longest > deadline:
            raise _OutOfBudget
        sleep(seconds)

    try:
        result = check(url, module=module, interval=interval, timeout=timeout, sleep=guarded_sleep,
                       clock=clock, on_observation=remember, **check_args)
        return Bounded(result, True, clock() - started)
    except _OutOfBudget:
        verdict = seen[-1][1]
        result = CheckResult(verdict, module, tuple(o for o, _ in seen))
        return Bounded(result, False, clock() - started)


@dataclass(frozen=True)
class Answer:
    """One endpoint's answer: ``ok`` (HTTP 200 / exit 0) and why."""
    ok: bool
    why: str


def liveness(bounded: Bounded | None, stalled_is_hung: bool = False) -> Answer:
    """Not alive only when the check says hung (or stalled, when asked): everything else is left
    running. A stall is for people by default: a restart may not heal it."""
    if bounded is None:
        return Answer(True, "no verdict within the budget (the backend is not known to be hung)")
    verdict = bounded.verdict
    if verdict.state == HUNG or (verdict.state == STALLED and stalled_is_hung):
        return Answer(False, f"{verdict.state}: {verdict.reason}")
    if not bounded.complete:
        return Answer(True, f"{verdict.state} (the budget ended the check before it settled): {verdict.reason}")
    return Answer(True, f"{verdict.state}: {verdict.reason}")


def readiness(bounded: Bounded | None) -> Answer:
    """Ready only when a request sent now would be served: idle and answering, busy, restarted
    and answering. Hung, down (loading), blind, asleep or a failed idle probe: not ready."""
    if bounded is None:
        return Answer(False, "no verdict within the budget")
    verdict, result = bounded.verdict, bounded.result
    last = result.observations[-1]
    if verdict.state == BUSY:
        return Answer(True, f"busy: {verdict.reason}")
    if verdict.state in (IDLE, RESTARTED) and verdict.exit_code == 0:
        if last.reading is not None and last.reading.asleep:
            return Answer(False, "asleep: the engine has offloaded its weights and serves nothing until woken")
        if last.probe is not None and last.probe.failed:
            return Answer(False, f"the idle probe failed: {last.probe.detail}")
        return Answer(True, f"{verdict.state}: {verdict.reason}")
    return Answer(False, f"{verdict.state}: {verdict.reason}")


def run_with_deadline(work: Callable[[], Bounded], seconds: float) -> Bounded | None:
    """``work()`` in a daemon thread; None when it has not finished after ``seconds``.

    ``bounded_check`` starts no reading it cannot finish in time, but one request can still
    overrun (a page trickling in); this is the wall-clock deadline that holds regardless.
    """
    outcome: list[Bounded] = []
    thread = threading.Thread(target=lambda: outcome.append(work()), daemon=True, name="hangwatch-bounded-check")
    thread.start()
    thread.join(max(0.0, seconds))
    return outcome[0] if outcome else None


def budget_error(interval: float, timeout: float, budget: float) -> str | None:
    """Why this budget cannot hold a whole check (None when it can)."""
    need = needed_budget(interval, timeout)
    if budget + 1e-9 < need:
        return (f"{budget:g}s cannot hold a check that reaches hung "
                f"(needs at least max(2 x timeout + interval, 2 x interval + timeout) + timeout"
                f" = {need:g}s)")
    if not math.isfinite(budget):
        return "must be finite"
    return None
