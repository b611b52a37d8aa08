"""Take one observation of a target: read its load, and, only at idle, probe it.

Every caller observes a target through a module whose observer is built from these pieces, so
each rule lives in one place: ``observe_load`` (never probe while anything is in flight, nor
an engine asleep, nor a target set to ``probe: none``), ``not_answered`` (no usable HTTP
answer: down, stalled or blind) and ``version_due`` (when the engine's version is asked).
Every request of one observation shares one ``Deadline``.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from functools import partial
from typing import Awaitable, Callable

from .client import Client, Fetched
from .deadline import Deadline
from .engines import ENGINES_BY_NAME
from .models_memo import ModelMemo
from .observation import (
    BLIND,
    BROKEN,
    OK,
    PROBE_NONE,
    REFUSED,
    TIMEOUT,
    TOO_LARGE,
    UNREACHABLE,
    Observation,
    Options,
    ProbeResult,
)
from .probe import send_probe
from .reading import UnreadablePage, parse
from .verdict import progress, same_process

# A load reader: (client, url, deadline, options, taken_at) -> Observation (OK with a reading, or not).
LoadReader = Callable[[Client, str, Deadline, Options, float], Awaitable[Observation]]
# A prober: (client, url, deadline, options) -> ProbeResult; given ``known`` (a ModelMemo) and
# ``started`` (the idle process's start time) as keywords when the observer has a memo.
Prober = Callable[[Client, str, Deadline, Options], Awaitable[ProbeResult]]

# A pause: await pause(seconds, within) -> bool waits ``seconds``; a caller that bounds concurrent
# work (the exporter's slots) lends its slot out meanwhile and says False when none came back
# within ``within`` seconds (then nothing more is sent: no probe is better than a late one).
Pause = Callable[[float, float], Awaitable[bool]]

_NOT_ANSWERED = (REFUSED, UNREACHABLE, TIMEOUT, BROKEN)


async def sleep(seconds: float, within: float) -> bool:
    """The pause of a caller that bounds nothing: a timer on the loop."""
    await asyncio.sleep(seconds)
    return True


def not_answered(taken_at: float, fetched: Fetched, what: str, *, named: bool = True) -> Observation | None:
    """The Observation for a request that got no usable HTTP answer, else None.

    ``named``: the error starts with ``what`` (a FastChat endpoint); a backend's /metrics
    failure is told as it is ("connection refused"), which is what the verdict's reason shows.
    """
    if fetched.status in _NOT_ANSWERED and not (fetched.status == BROKEN and fetched.http_status is not None):
        error = f"{what}: {fetched.error}" if named else fetched.error
        status = UNREACHABLE if fetched.status == BROKEN else fetched.status
        return Observation(taken_at, status, error=error, scrape_seconds=fetched.elapsed)
    if fetched.status == TOO_LARGE:
        return Observation(taken_at, BLIND, error=f"{what} {fetched.error}", scrape_seconds=fetched.elapsed)
    return None


# Before an idle probe, the load is read again this long after the reading that found nothing
# in flight: an engine's gauges count only what reached its scheduler, not a request the API
# server is still receiving (docs/design.md, "a health check must not consume what it protects").
IDLE_CONFIRM_S = 0.25


async def observe_load(client: Client, url: str, deadline: Deadline, options: Options, *,
                       read: LoadReader, probe: Prober, clock: Callable[[], float] = time.monotonic,
                       known: ModelMemo | None = None, pause: Pause = sleep) -> Observation:
    """Read the load; probe only when two readings ``IDLE_CONFIRM_S`` apart show nothing in
    flight and no engine work between them (the rule, once). ``known``: the probe's models
    remembered per process (``ModelMemo``), handed to the prober with the idle process's start.
    ``pause``: how the wait between the readings is spent (``sleep``, or the exporter's, which
    lends out its work slot meanwhile)."""
    url = url.rstrip("/")
    observation = await read(client, url, deadline, options, clock())
    if not probe_due(observation, options):
        return observation
    wait = min(IDLE_CONFIRM_S, max(0.0, deadline.left() / 4))
    if not await pause(wait, max(0.0, deadline.left() - wait) / 4):
        return replace(observation, detail="nothing in flight; not probed: no probe slot came free in time "
                                           "after the idle confirmation's wait")
    again = await read(client, url, deadline, options, clock())
    if not probe_due(again, options):
        return again  # work in flight now (busy), or the load could no longer be read
    moved = moved_between(observation, again)
    if moved:
        return replace(again, detail=f"nothing in flight, and the engine worked in the last {wait:.2f}s "
                                     f"({', '.join(moved)} moved): not probed")
    if known is not None:
        probe = partial(probe, known=known, started=again.reading.process_start)
    return replace(again, probe=await probe(client, url, deadline, options))


def moved_between(before: Observation, after: Observation) -> list[str]:
    """The engine's progress signals that moved between two readings of one process (the
    verdict's own definitions of both)."""
    if before.reading is None or after.reading is None or not same_process(before.reading, after.reading):
        return []
    return progress(before.reading, after.reading)


def probe_due(observation: Observation, options: Options) -> bool:
    """The idle probe goes out only when a reading shows nothing in flight, the engine awake."""
    reading = observation.reading
    return (observation.status == OK and reading is not None and reading.in_flight == 0
            and not reading.asleep and options.probe != PROBE_NONE)


async def read_metrics(client: Client, url: str, deadline: Deadline, options: Options, taken_at: float) -> Observation:
    """An engine's /metrics page as a Reading (and its version, if the engine says it cheaply)."""
    fetched = await client.request("GET", url + "/metrics", deadline=deadline, headers=options.auth_headers())
    return metrics_observation(taken_at, fetched, options)


def metrics_observation(taken_at: float, fetched: Fetched, options: Options) -> Observation:
    """What a fetched /metrics page says."""
    failed = not_answered(taken_at, fetched, "/metrics", named=False)
    if failed is not None:
        return failed
    if fetched.status != OK:
        return Observation(taken_at, BLIND, error=f"/metrics answered {fetched.error}", scrape_seconds=fetched.elapsed)
    try:
        reading = parse(fetched.body, options.engine)  # bytes: the page is never decoded whole
    except UnreadablePage as exc:
        return Observation(taken_at, BLIND, error=f"/metrics unusable: {exc}", scrape_seconds=fetched.elapsed)
    return Observation(taken_at, OK, reading=reading, scrape_seconds=fetched.elapsed)


def version_due(engine: str, deadline: Deadline) -> bool:
    """Whether ``engine_version`` would send a request: the engine has a version endpoint and
    time is left (the exporter's loop asks this to know whether a worker must finish the probe)."""
    spec = ENGINES_BY_NAME.get(engine)
    return spec is not None and spec.version_path is not None and deadline.left() >= 0.05


async def engine_version(client: Client, url: str, engine: str, deadline: Deadline, options: Options) -> str | None:
    """The engine's version from its cheap version endpoint (vLLM /version never touches the engine)."""
    if not version_due(engine, deadline):
        return None
    spec = ENGINES_BY_NAME[engine]
    fetched = await client.request("GET", url + spec.version_path, deadline=deadline, max_bytes=4096,
                             headers=options.auth_headers())
    if fetched.status != OK:
        return None
    try:
        version = json.loads(fetched.body).get("version")
    except (ValueError, AttributeError):
        return None
    return str(version)[:64] if version else None


async def observe_backend(client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                          clock: Callable[[], float] = time.monotonic,
                          known: ModelMemo | None = None, pause: Pause = sleep) -> Observation:
    """An engine: its /metrics, and the idle probe when due. ``known``: the probe's models
    remembered per process, kept by a caller that observes again (the exporter); None asks
    /v1/models before every probe. Its version is ``engine_version``'s: the exporter asks it
    once per process, not per reading. ``pause``: ``observe_load``'s."""
    return await observe_load(client, url, deadline, options, read=read_metrics, probe=send_probe, clock=clock,
                              known=known, pause=pause)


async def observe_proxy(client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                        clock: Callable[[], float] = time.monotonic, known: ModelMemo | None = None,
                        pause: Pause = sleep) -> Observation:
    """A proxy is asked only for /v1/models: its /metrics would mix many backends (``known``,
    ``pause``: unused, every observer takes them)."""
    taken_at = clock()
    fetched = await client.request("GET", url.rstrip("/") + "/v1/models", deadline=deadline, max_bytes=1 << 20,
                             headers=options.auth_headers())
    failed = not_answered(taken_at, fetched, "/v1/models", named=False)
    if failed is not None:
        return failed
    if fetched.status != OK and fetched.http_status in (401, 403):
        what = ("it rejected the API key hangwatch sent" if options.api_key
                else "give hangwatch its API key to see its model list")
        return Observation(taken_at, OK, scrape_seconds=fetched.elapsed,
                           detail=f"proxy answers /v1/models (HTTP {fetched.http_status}: {what})")
    if fetched.status != OK:
        return Observation(taken_at, BLIND, error=f"/v1/models answered {fetched.error}", scrape_seconds=fetched.elapsed)
    return Observation(taken_at, OK, scrape_seconds=fetched.elapsed)
