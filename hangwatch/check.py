"""The non-consuming check as one call: read, wait, read again, until the verdict settles.

``hangwatch check`` (for a Docker HEALTHCHECK, cron or an exec probe) and the webhook's
re-check both use ``check``. It takes a reading, and only if the verdict could still
change does it wait ``interval`` seconds and take another: an idle server with a good probe
or a busy server whose counters moved is settled after one or two readings; "hung" always
needs three readings (two intervals) of in-flight work with nothing moving. Given a stall
window, a busy server whose output has not moved yet is read on until the readings span the
window: ``stalled`` needs that long without a token out or a request answered.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import threading
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

from .client import Client
from .deadline import Deadline
from .modules import module as module_named
from .observation import PROBE_AUTO, Observation, Options
from .verdict import Verdict, judge, min_grace

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None] | None]


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    module: str
    observations: tuple[Observation, ...]

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def probe_sent(self) -> bool:
        return any(o.probe is not None for o in self.observations)

    @property
    def last_probe(self):
        return next((o.probe for o in reversed(self.observations) if o.probe is not None), None)

    @property
    def last_reading(self):
        return next((o.reading for o in reversed(self.observations) if o.reading is not None), None)

    def as_json(self) -> dict:
        reading = self.observations[-1].reading
        latest = self.last_reading
        return {
            "verdict": self.verdict.state,
            "reason": self.verdict.reason,
            "in_flight": reading.in_flight if reading else None,
            "running": reading.running if reading else None,
            "waiting": reading.waiting if reading else None,
            "probe_sent": self.probe_sent,
            "probe": self.last_probe.as_dict() if self.last_probe else None,
            "deferred": reading.deferred if reading else None,
            "engine": latest.engine if latest else None,
            "models": list(latest.models) if latest else list(self.observations[-1].listed_models or ()),
            "module": self.module,
            "readings": len(self.observations),
            "output": reading.output() if reading else None,
            "exit_code": self.exit_code,
        }


def check(url: str, *, module: str = "backend", interval: float = 5.0, timeout: float = 5.0, grace: float = 0.0,
          stall_window: float | None = None, engine: str | None = None, api_key: str | None = None,
          probe: str = PROBE_AUTO, client: Client | None = None, sleep: Sleep = asyncio.sleep,
          clock: Callable[[], float] = time.monotonic,
          on_observation: Callable[[Observation, Verdict], None] | None = None) -> CheckResult:
    """``check_async`` for a caller with no event loop of its own (``hangwatch check``, the
    webhook's worker threads): the whole check on a loop of its own (``run_sync``)."""
    return run_sync(check_async(url, module=module, interval=interval, timeout=timeout, grace=grace,
                                stall_window=stall_window, engine=engine, api_key=api_key, probe=probe,
                                client=client, sleep=sleep, clock=clock, on_observation=on_observation))


class _DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor for ``run_sync``: a thread per call (a name lookup), a daemon,
    so a ``getaddrinfo`` that never returns is left behind, not joined, at the loop's close and
    at the process's exit (``asyncio.run`` and a plain ``ThreadPoolExecutor`` join theirs). A
    ``ThreadPoolExecutor`` only by type: asyncio takes no other as the default; none of its workers run."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(exc)
        threading.Thread(target=work, name="hangwatch-lookup", daemon=True).start()
        return future


def run_sync(work: Awaitable[T]) -> T:
    """``work`` on a new loop of its own, which is then closed without waiting for lookups the
    deadline gave up on (``asyncio.run`` would wait for them: the CLI would hang at exit)."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_DaemonThreads())
    try:
        return loop.run_until_complete(work)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


async def pause(sleep: Sleep, seconds: float) -> None:
    """``sleep(seconds)``, awaited when it is a coroutine function (a plain one is a test's fake clock)."""
    slept = sleep(seconds)
    if inspect.isawaitable(slept):
        await slept


async def check_async(url: str, *, module: str = "backend", interval: float = 5.0, timeout: float = 5.0,
                      grace: float = 0.0, stall_window: float | None = None, engine: str | None = None,
                      api_key: str | None = None, probe: str = PROBE_AUTO, client: Client | None = None,
                      sleep: Sleep = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
                      on_observation: Callable[[Observation, Verdict], None] | None = None) -> CheckResult:
    """Observe ``url`` until the verdict is settled (at most a few intervals).

    Each reading — its /metrics, the idle probe, everything — finishes within ``timeout``
    seconds of wall-clock time, whatever the server does. ``sleep`` waits between readings
    (awaited when it is a coroutine function; a plain function is a test's fake clock).
    """
    observe = module_named(module).observe
    options = Options(engine=engine, api_key=api_key, probe=probe)
    own_client = client is None
    client = client or Client()
    observations: list[Observation] = []
    try:
        while True:
            observation = await observe(client, url, Deadline.after(timeout), options, clock=clock)
            observations.append(observation)
            verdict = judge(observations, grace=grace, stall_window=stall_window)
            if on_observation:
                on_observation(observation, verdict)
            if verdict.settled or len(observations) >= _max_readings(observations, interval,
                                                                       max(grace, stall_window or 0.0)):
                return CheckResult(verdict, module, tuple(observations))
            await pause(sleep, interval)
    finally:
        if own_client:
            client.close()


def _max_readings(observations, interval: float, grace: float) -> int:
    """Enough readings for two intervals plus the grace — the caller's or the engine's own — or
    the stall window, if longer."""
    engine = next((o.reading.engine for o in observations if o.reading is not None), None)
    longest = max(grace, min_grace(engine) if engine else 0.0)
    return 4 + math.ceil(longest / interval)
