"""Observe a FastChat deployment (model workers, controller, OpenAI API server) without side effects.

No FastChat server has /metrics, and several cheap-looking endpoints change what the
deployment does (docs/fleets.md): so each module reads only endpoints shown to change nothing.
``fastchat_worker``: ``/worker_get_status`` (its ``queue_length`` is in flight), and at 0 one
token from ``/worker_generate``; with no progress counter, a worker with work queued is busy,
unverified, never hung. ``fastchat_controller``: ``/test_connection`` and ``/list_models``.
``fastchat_api``: a chat request naming a model that can never be registered (a comma in
its name), which the server answers 400 with the registered models before any worker is asked.
"""
from __future__ import annotations

import json
import time
from typing import Callable

from .client import Client, Fetched
from .deadline import Deadline
from .models_memo import ModelMemo
from .observation import BLIND, OK, PROBE_ANSWERED, PROBE_FAILED, TIMEOUT, Observation, Options, ProbeResult
from .observe import Pause, not_answered, observe_load, sleep
from .probe import outcome_of
from .reading import Reading

ENGINE = "fastchat"
# A model name no FastChat worker can register (``--model-names`` is split on commas).
UNKNOWN_MODEL = "hangwatch,no-such-model"
INVALID_MODEL = 40301  # fastchat.constants.ErrorCode.INVALID_MODEL
_MAX_ANSWER = 1 << 20
WORKER_PROBE = "worker_generate"


def _json(fetched: Fetched):
    try:
        return json.loads(fetched.body)
    except ValueError:
        return None


def _names(value) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        return None
    return tuple(value)


def worker_reading(status) -> Reading:
    """A worker's ``/worker_get_status`` answer as a Reading; ValueError if it is not one."""
    if not isinstance(status, dict):
        raise ValueError("not a JSON object")
    queue = status.get("queue_length")
    if isinstance(queue, bool) or not isinstance(queue, (int, float)) or not 0 <= queue < 1e9:
        raise ValueError(f"queue_length {queue!r} is not a count")
    models = _names(status.get("model_names"))
    if models is None:
        raise ValueError("model_names is not a list of names")
    # queue_length = requests holding the worker's semaphore + requests waiting for it; the
    # split is not exposed, so all of it counts as running (in flight is what matters).
    return Reading(engine=ENGINE, running=float(queue), waiting=0.0, models=models[:32])


async def send_worker_probe(client: Client, base_url: str, deadline: Deadline, options: Options = Options()) -> ProbeResult:
    """One greedy token, asked of the idle worker itself (not through the controller)."""
    body = {"prompt": "ping", "max_new_tokens": 1, "temperature": 0, "echo": False}
    fetched = await client.request("POST", base_url + "/worker_generate", deadline=deadline, max_bytes=_MAX_ANSWER,
                             json=body)
    what = "1-token /worker_generate"
    outcome = outcome_of(fetched)
    if outcome != PROBE_ANSWERED:
        detail = f"{what}: {fetched.error}" if outcome == PROBE_FAILED else \
            f"{what} was rejected with HTTP {fetched.http_status}: the worker refused it before generating"
        return ProbeResult(outcome, fetched.elapsed, detail, kind=WORKER_PROBE, http_status=fetched.http_status)
    answer = _json(fetched)
    code = answer.get("error_code") if isinstance(answer, dict) else None
    if code != 0:  # the worker answered, but its generation failed (FastChat's own error codes)
        text = str(answer.get("text", ""))[:120] if isinstance(answer, dict) else fetched.text[:120]
        return ProbeResult(PROBE_FAILED, fetched.elapsed, f"{what}: error_code {code!r}: {text}",
                           kind=WORKER_PROBE, http_status=fetched.http_status)
    return ProbeResult(PROBE_ANSWERED, fetched.elapsed, f"{what} answered in {fetched.elapsed * 1000:.0f} ms",
                       kind=WORKER_PROBE, http_status=fetched.http_status)


async def read_worker_status(client: Client, url: str, deadline: Deadline, options: Options, taken_at: float) -> Observation:
    """The worker's queue as a Reading (``POST /worker_get_status``: milliseconds, even when busy)."""
    fetched = await client.request("POST", url + "/worker_get_status", deadline=deadline, max_bytes=_MAX_ANSWER)
    failed = not_answered(taken_at, fetched, "/worker_get_status")
    if failed is not None:
        return failed
    if fetched.status != OK:
        return Observation(taken_at, BLIND, error=f"/worker_get_status answered {fetched.error} (not a FastChat "
                                                  "model worker?)", scrape_seconds=fetched.elapsed)
    try:
        reading = worker_reading(_json(fetched))
    except ValueError as exc:
        return Observation(taken_at, BLIND, error=f"/worker_get_status unusable: {exc}",
                           scrape_seconds=fetched.elapsed)
    return Observation(taken_at, OK, reading=reading, scrape_seconds=fetched.elapsed)


async def observe_worker(client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                   clock: Callable[[], float] = time.monotonic, known: ModelMemo | None = None,
                   pause: Pause = sleep) -> Observation:
    """Read the worker's queue; probe it only if nothing is queued."""
    return await observe_load(client, url, deadline, options, read=read_worker_status, probe=send_worker_probe,
                        clock=clock, pause=pause)


async def observe_controller(client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                       clock: Callable[[], float] = time.monotonic, known: ModelMemo | None = None,
                       pause: Pause = sleep) -> Observation:
    """``GET /test_connection`` then ``POST /list_models``: answering, and which models are registered."""
    base_url = url.rstrip("/")
    taken_at = clock()
    started = time.monotonic()
    fetched = await client.request("GET", base_url + "/test_connection", deadline=deadline, max_bytes=_MAX_ANSWER)
    failed = not_answered(taken_at, fetched, "/test_connection")
    if failed is not None:
        return failed
    if fetched.status != OK or _json(fetched) != "success":
        return Observation(taken_at, BLIND, error="/test_connection did not answer \"success\" (not a FastChat "
                                                  "controller?)", scrape_seconds=fetched.elapsed)
    fetched = await client.request("POST", base_url + "/list_models", deadline=deadline, max_bytes=_MAX_ANSWER)
    elapsed = time.monotonic() - started
    failed = not_answered(taken_at, fetched, "/list_models")
    if failed is not None:
        return failed
    answer = _json(fetched)
    models = _names(answer.get("models")) if fetched.status == OK and isinstance(answer, dict) else None
    if models is None:
        return Observation(taken_at, BLIND, error=f"/list_models unusable ({fetched.error or 'no model list'})",
                           scrape_seconds=elapsed)
    models = sorted(models)[:64]
    return Observation(taken_at, OK, listed_models=tuple(models), scrape_seconds=elapsed,
                       detail=f"controller answers; {len(models)} model(s) registered: "
                              f"{', '.join(models) or 'none'}")


def api_models(message: str) -> tuple[str, ...] | None:
    """The models in FastChat's "Only a&&b allowed now, your model X" message, or None."""
    head, sep, _ = message.partition(" allowed now, your model ")
    if not sep or not head.startswith("Only "):
        return None
    names = head[len("Only "):]
    return tuple(sorted(name for name in names.split("&&") if name))[:64] if names else ()


async def observe_api(client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                clock: Callable[[], float] = time.monotonic, known: ModelMemo | None = None,
                pause: Pause = sleep) -> Observation:
    """A chat request naming a model that cannot exist: 400 with the registered models is an answer."""
    base_url = url.rstrip("/")
    taken_at = clock()
    body = {"model": UNKNOWN_MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    fetched = await client.request("POST", base_url + "/v1/chat/completions", deadline=deadline, max_bytes=_MAX_ANSWER,
                             json=body, headers=options.auth_headers())
    failed = not_answered(taken_at, fetched, "/v1/chat/completions")
    if failed is not None:
        if failed.status == TIMEOUT:
            failed = Observation(taken_at, TIMEOUT, error=f"{failed.error} (the API server, or the controller "
                                                          "it asks, is wedged)", scrape_seconds=failed.scrape_seconds)
        return failed
    answer = _json(fetched)
    if fetched.http_status == 401:
        what = ("it rejected the API key hangwatch sent" if options.api_key
                else "API keys are set; give hangwatch one to check its controller too")
        return Observation(taken_at, OK, scrape_seconds=fetched.elapsed, detail=f"API server answers (401: {what})")
    if fetched.http_status == 400 and isinstance(answer, dict) and answer.get("code") == INVALID_MODEL:
        models = api_models(str(answer.get("message", "")))
        if models is not None:
            return Observation(taken_at, OK, listed_models=models, scrape_seconds=fetched.elapsed,
                               detail=f"API server and its controller answer; {len(models)} model(s) registered: "
                                      f"{', '.join(models) or 'none'}")
    if fetched.http_status is not None and fetched.http_status >= 500:
        return Observation(taken_at, BLIND, scrape_seconds=fetched.elapsed,
                           error=f"API server answers HTTP {fetched.http_status}: it cannot ask its controller")
    return Observation(taken_at, BLIND, scrape_seconds=fetched.elapsed,
                       error=f"an unknown model was not refused as FastChat does (HTTP {fetched.http_status}; "
                             "not a FastChat API server?)")
