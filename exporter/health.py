"""``/livez`` and ``/readyz``: a kubelet's questions about one backend, answered in time.

``GET /livez?target=URL&module=MODULE`` is 503 only when the bounded check
(``hangwatch.liveness``) says ``hung``, else 200; ``GET /readyz?...`` is 200 only when the
backend can take work now. Both are answered from the same check: concurrent calls for one
target and module — several kubelets, a liveness and a readiness probe landing together, a
router asking too — share one check instead of each sending its own idle probe, and no
second check of a target starts while one is still running. Nothing is kept once a check
has answered, so two exporters (or a restarted one) answer alike.

The query is read by the same validator as ``/probe``'s (``exporter/query.py``: 400, 403; a
query may narrow what the config allows for a target, never widen it): the exporter is not
an open relay, and a check uses the target's key only where the config sends it. The body is one JSON object (the check's own
``hangwatch check --json`` fields plus the decision), for people and routers; a kubelet
reads only the status.

A check runs on after its callers have gone (shielded; its own budget bounds it), so targets
the config does not list (``allow_targets`` empty: any target on loopback, or
``allow_any_target``) could start checks without end: at most ``max_concurrent_probes`` checks
of unlisted targets run at once, and a call that would start one more is answered as overloaded
(``overloaded``). The targets in ``allow_targets`` and ``targets`` bound their own checks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Awaitable, Callable

from prometheus_client import Counter

from hangwatch import liveness
from hangwatch.client import Client
from hangwatch.liveness import Bounded, StartupClock
from hangwatch.observation import Options

from .config import ExporterConfig
from .fds import HEALTH_IDLE_CONNECTIONS
from .query import Refused, asked

log = logging.getLogger("hangwatch.exporter")

ANSWERS = Counter("hangwatch_exporter_health_answers", "Answers of /livez and /readyz, by endpoint and HTTP code.",
                  ["endpoint", "code"])
CHECKS = Counter("hangwatch_exporter_health_checks", "Bounded checks started for /livez and /readyz "
                 "(fewer than answers when concurrent calls share one).")

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class ChecksFull(Exception):
    """As many checks as allowed are running, none of them this call's to share."""


def overloaded(endpoint: str) -> tuple[int, str, bytes]:
    """No check for this call now (no slot free in time, or ``ChecksFull``); counted as any
    answer. Liveness says alive (a restart needs proof of a hang), readiness says not ready."""
    code = 200 if endpoint == "livez" else 503
    ANSWERS.labels(endpoint, str(code)).inc()
    return code, TEXT, b"overloaded: no slot free to check; not a verdict on the target\n"


class SharedChecks:
    """At most one bounded check per (target, module, options) at a time; callers meanwhile share
    it. A check is a task on the loop; each caller awaits it until the check's own deadline (the
    check may overrun it — one request trickling — and is still shared until it ends)."""

    def __init__(self, run: Callable[[str, str, Options], Awaitable[Bounded | None]], budget: float,
                 clock: Callable[[], float] = time.monotonic, startup: StartupClock | None = None,
                 most: int | None = None, listed: frozenset[str] = frozenset()):
        self._run, self._budget, self._clock = run, budget, clock
        self.most, self.listed = most, listed  # at most ``most`` checks of targets not ``listed`` at once
        self.startup = startup  # with startup_deadline: how long each target has been down
        self._running: dict[tuple[str, str, Options], tuple[asyncio.Task, float]] = {}

    async def result(self, target: str, module: str, options: Options = Options()) -> tuple[Bounded | None, bool]:
        """The check's outcome (None: not finished by its deadline) and whether it was shared.
        Raises ``ChecksFull`` when it would start one more check of an unlisted target than ``most``."""
        key = (target, module, options)
        running = self._running.get(key)
        shared = running is not None
        if running is None:
            if self.most is not None and target not in self.listed and \
                    sum(other not in self.listed for other, _, _ in self._running) >= self.most:
                raise ChecksFull
            task = asyncio.get_running_loop().create_task(self._check(key), name=f"hangwatch-check-{target}")
            running = self._running[key] = (task, self._clock() + self._budget)
            CHECKS.inc()
        task, deadline = running
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - self._clock())), shared
        except asyncio.TimeoutError:
            return None, shared

    async def _check(self, key: tuple[str, str, Options]) -> Bounded | None:
        try:
            return await self._run(*key)
        except Exception:  # noqa: BLE001 - a broken check is "no verdict", never a crashed answer
            log.exception("bounded check of %s failed", key[0])
            return None
        finally:
            del self._running[key]


def shared_checks(config: ExporterConfig) -> SharedChecks:
    client = Client(max_idle=HEALTH_IDLE_CONNECTIONS)

    async def run(target: str, module: str, options: Options) -> Bounded:
        return await liveness.bounded_check_async(
            target, module=module, interval=config.liveness_interval, timeout=config.liveness_timeout,
            budget=config.liveness_budget, api_key=options.api_key, probe=options.probe, client=client)
    startup = StartupClock(config.startup_deadline) if config.startup_deadline else None
    listed = frozenset(config.allow_targets) | {options.url for options in config.targets}
    return SharedChecks(run, config.liveness_budget, startup=startup, most=config.max_concurrent_probes, listed=listed)


async def answer_health(endpoint: str, query: str, config: ExporterConfig,
                        checks: SharedChecks) -> tuple[int, str, bytes]:
    """``endpoint`` is ``livez`` or ``readyz``: (HTTP code, content type, body)."""
    read = asked(query, config)
    if isinstance(read, Refused):
        ANSWERS.labels(endpoint, str(read.code)).inc()
        return read.code, "text/plain", f"{read.why}\n".encode()
    target, module = read.target, read.module
    started = time.monotonic()
    try:
        outcome, shared = await checks.result(target, module, read.options)
    except ChecksFull:
        return overloaded(endpoint)
    answer = (liveness.liveness if endpoint == "livez" else liveness.readiness)(outcome)
    if checks.startup is not None and outcome is not None:
        down_for = checks.startup.overdue((target, module), outcome.verdict.state)
        answer = liveness.past_deadline(answer, endpoint, down_for, config.startup_deadline)
    code = 200 if answer.ok else 503
    body = {"endpoint": endpoint, "status": code, "ok": answer.ok, "why": answer.why, "target": target,
            "module": module, "shared": shared, "seconds": round(time.monotonic() - started, 3)}
    if outcome is not None:
        body |= outcome.result.as_json() | {"complete": outcome.complete, "check_seconds": round(outcome.seconds, 3)}
    else:
        body |= {"verdict": None, "complete": False}
    ANSWERS.labels(endpoint, str(code)).inc()
    log.log(logging.WARNING if code == 503 and endpoint == "livez" else logging.DEBUG,
            "%s target=%s module=%s code=%d shared=%s why=%s", endpoint, target, module, code, shared, answer.why)
    return code, JSON, (json.dumps(body) + "\n").encode()
