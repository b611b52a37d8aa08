"""One check that always answers in time, and what a kubelet's two questions make of it.

A kubelet counts a probe that does not answer within ``timeoutSeconds`` as a failure, so
``bounded_check`` runs the ordinary ``check`` but starts a reading only when it can still
finish inside the budget; when the budget runs out, the verdict so far stands (never ``hung``).
``liveness`` fails only on ``hung`` (a pod loading weights or in a long prefill is never
killed); ``readiness`` only passes a backend that can take work now. Each kind of hang needs
two timeouts and one interval (wedged, failed probe) or two intervals and one timeout
(stalled), plus one timeout of margin: ``budget_error`` refuses a budget shorter than that.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .check import CheckResult, Sleep, check_async, pause, run_sync
from .client import Client
from .observation import PROBE_AUTO, Observation
from .settings import ConfigError, boolean, duration, show
from .verdict import BUSY, DOWN, HUNG, IDLE, RESTARTED, STALLED, Verdict

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


def bounded_check(url: str, *, module: str = "backend", interval: float = INTERVAL, timeout: float = TIMEOUT,
                  budget: float = BUDGET, clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
                  on_observation: Callable[[Observation, Verdict], None] | None = None, grace: float = 0.0,
                  stall_window: float | None = None, engine: str | None = None, api_key: str | None = None,
                  probe: str = PROBE_AUTO, client: Client | None = None) -> Bounded:
    """``bounded_check_async`` for a caller with no event loop of its own (``run_sync``)."""
    return run_sync(bounded_check_async(url, module=module, interval=interval, timeout=timeout, budget=budget,
                                        clock=clock, sleep=sleep, on_observation=on_observation, grace=grace,
                                        stall_window=stall_window, engine=engine, api_key=api_key, probe=probe,
                                        client=client))


async def bounded_check_async(url: str, *, module: str = "backend", interval: float = INTERVAL,
                              timeout: float = TIMEOUT, budget: float = BUDGET,
                              clock: Callable[[], float] = time.monotonic,
                              sleep: Sleep = asyncio.sleep,
                              on_observation: Callable[[Observation, Verdict], None] | None = None,
                              **check_args: Any) -> Bounded:
    """``check(url, ...)``, taking a next reading only when it can finish within ``budget``.

    ``check_args`` go to ``hangwatch.check.check_async`` unchanged (``grace``, ``engine``,
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

    async def guarded_sleep(seconds: float) -> None:
        if clock() + seconds + longest > deadline:
            raise _OutOfBudget
        await pause(sleep, seconds)

    try:
        result = await check_async(url, module=module, interval=interval, timeout=timeout, sleep=guarded_sleep,
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


async def within(work: Awaitable[Bounded], seconds: float) -> Bounded | None:
    """``work`` awaited for at most ``seconds``; None when it has not finished by then (it is cancelled).

    ``bounded_check`` starts no reading it cannot finish in time, but one request can still
    overrun (a page trickling in); this is the wall-clock deadline that holds regardless.
    """
    try:
        return await asyncio.wait_for(work, max(0.0, seconds))
    except asyncio.TimeoutError:
        return None


def run_with_deadline(work: Callable[[], Awaitable[Bounded]], seconds: float) -> Bounded | None:
    """``within`` for a caller with no event loop of its own (``hangwatch check --liveness``)."""
    return run_sync(within(work(), seconds))


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


# After the startup deadline has passed and /livez has said so, how long before a server still
# down gets a new deadline: the kubelet restarts a container after failureThreshold x
# periodSeconds (30 s with the recommended probe) and the new process must load from scratch.
RESTART_WINDOW = 60.0


@dataclass(frozen=True)
class StartupDeadline:
    """``startup_deadline``: a server down (port closed: still loading) for longer than ``after``
    is reported as past it by /readyz, and, only if ``fails_liveness``, fails /livez."""
    after: float
    fails_liveness: bool = False


def startup_deadline(value: Any, path: str = "startup_deadline") -> StartupDeadline:
    """``20m``, or ``{after: 20m, fails_liveness: true}``."""
    if isinstance(value, dict):
        unknown = set(value) - {"after", "fails_liveness"}
        if unknown:
            raise ConfigError(f"{path}.{sorted(unknown)[0]}: unknown key (known: after, fails_liveness)")
        if "after" not in value:
            raise ConfigError(f"{path}.after: required")
        fails = boolean(value["fails_liveness"], f"{path}.fails_liveness") if "fails_liveness" in value else False
        return StartupDeadline(duration(value["after"], f"{path}.after", low=1.0, high=7 * 86400.0), fails)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return StartupDeadline(duration(value, path, low=1.0, high=7 * 86400.0))
    raise ConfigError(f"{path}: expected a duration or {{after, fails_liveness}}, got {show(value)}")


class StartupClock:
    """How long each target has been down without a break, as the checks behind /livez and
    /readyz saw it: the one thing the exporter remembers between calls, because "still loading
    after 20 minutes" cannot be read from one check. Any other verdict ends the streak."""

    def __init__(self, deadline: StartupDeadline, clock: Callable[[], float] = time.monotonic):
        self.deadline, self._clock = deadline, clock
        self._lock = threading.Lock()
        self._since: dict[Any, float] = {}

    def overdue(self, key: Any, state: str) -> float | None:
        """Seconds down when past the deadline, else None. Once /livez has failed for the
        kubelet's restart window, a server still down is a new process: a new deadline."""
        with self._lock:
            now = self._clock()
            if state != DOWN:
                self._since.pop(key, None)
                return None
            since = self._since.setdefault(key, now)
            if self.deadline.fails_liveness and now - since > self.deadline.after + RESTART_WINDOW:
                self._since[key] = since = now
            down_for = now - since
            return down_for if down_for > self.deadline.after else None


def past_deadline(answer: Answer, endpoint: str, down_for: float | None, deadline: StartupDeadline | None) -> Answer:
    """The answer once a server has been down past ``startup_deadline``: not ready, and not
    alive only where the deadline says ``fails_liveness``."""
    if down_for is None or deadline is None:
        return answer
    why = f"down for {down_for:.0f}s, past startup_deadline {deadline.after:g}s: {answer.why}"
    if endpoint == "readyz" or deadline.fails_liveness:
        return Answer(False, why)
    return Answer(True, why)
