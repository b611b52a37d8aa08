"""Observe a FastChat deployment — model workers, controller, OpenAI API server — without side effects.

No FastChat server has /metrics, and several of its cheap-looking endpoints change what
the deployment does (measured on fschat 0.2.36, see docs/fleets.md): the controller's
``/get_worker_address`` adds 1 to a worker's queue, the API server's ``/v1/models`` makes the
controller re-register every worker (and drop a hung one), and the controller's
``/worker_get_status`` asks each worker in turn inside its request loop. So each module
here reads exactly one or two endpoints that were shown to change nothing:

- ``fastchat_worker``: ``POST /worker_get_status`` → ``{"model_names", "speed",
  "queue_length"}``; ``queue_length`` (running + waiting) is the in-flight count. Only when
  it is 0 is the worker asked for one token, straight (``POST /worker_generate``,
  ``max_new_tokens`` 1). FastChat has no progress counter, so a worker with work queued is
  "busy, unverified" (see ``verdict``): never hung on that basis.
- ``fastchat_controller``: ``GET /test_connection`` and ``POST /list_models`` (names only).
- ``fastchat_api``: ``POST /v1/chat/completions`` naming a model that cannot be registered
  (FastChat splits ``--model-names`` on commas, so a name with a comma never is): the API
  server asks its controller's ``/list_models`` and answers 400 with the registered models,
  before it looks for any worker.
"""
from __future__ import annotations

import json
import time

import requests

from .fetch import OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE, Fetched, request
from .observe import ANSWERED, BLIND, Observation
from .probe import ProbeResult
from .reading import Reading

ENGINE = "fastchat"
# A model name no FastChat worker can register (``--model-names`` is split on commas).
UNKNOWN_MODEL = "hangwatch,no-such-model"
INVALID_MODEL = 40301  # fastchat.constants.ErrorCode.INVALID_MODEL
_MAX_ANSWER = 1 << 20


def _not_answered(taken_at: float, fetched: Fetched, what: str) -> Observation | None:
    """The Observation for a request that did not give a usable HTTP answer, else None."""
    if fetched.status in (REFUSED, UNREACHABLE, TIMEOUT):
        return Observation(taken_at, fetched.status, error=f"{what}: {fetched.error}", scrape_seconds=fetched.elapsed)
    if fetched.status == TOO_LARGE:
        return Observation(taken_at, BLIND, error=f"{what} {fetched.error}", scrape_seconds=fetched.elapsed)
    return None


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
    return Reading(engine=ENGINE, running=float(queue), waiting=0.0, models=models)


def send_worker_probe(session: requests.Session, base_url: str, timeout: float) -> ProbeResult:
    """One greedy token, asked of the idle worker itself (not through the controller)."""
    body = {"prompt": "ping", "max_new_tokens": 1, "temperature": 0, "echo": False}
    fetched = request(session, "POST", base_url + "/worker_generate", timeout=timeout, max_bytes=_MAX_ANSWER,
                      json=body)
    if fetched.status != OK:
        return ProbeResult(False, fetched.elapsed, f"1-token /worker_generate: {fetched.error}")
    answer = _json(fetched)
    code = answer.get("error_code") if isinstance(answer, dict) else None
    if code != 0:
        text = str(answer.get("text", ""))[:120] if isinstance(answer, dict) else fetched.text[:120]
        return ProbeResult(False, fetched.elapsed, f"1-token /worker_generate: error_code {code!r}: {text}")
    return ProbeResult(True, fetched.elapsed,
                       f"1-token /worker_generate answered in {fetched.elapsed * 1000:.0f} ms")


def observe_worker(session: requests.Session, base_url: str, *, timeout: float,
                   probe_timeout: float | None = None, allow_probe: bool = True,
                   clock=time.monotonic) -> Observation:
    """Read the worker's queue; probe it only if nothing is queued."""
    base_url = base_url.rstrip("/")
    taken_at = clock()
    fetched = request(session, "POST", base_url + "/worker_get_status", timeout=timeout, max_bytes=_MAX_ANSWER)
    failed = _not_answered(taken_at, fetched, "/worker_get_status")
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
    probe = None
    if allow_probe and reading.in_flight == 0:
        # Without a probe_timeout the probe gets what is left of the budget (as observe_backend).
        probe = send_worker_probe(session, base_url, probe_timeout or max(0.1, timeout - fetched.elapsed))
    return Observation(taken_at, ANSWERED, reading=reading, probe=probe, scrape_seconds=fetched.elapsed)


def observe_controller(session: requests.Session, base_url: str, *, timeout: float,
                       clock=time.monotonic) -> Observation:
    """``GET /test_connection`` then ``POST /list_models``: answering, and which models are registered."""
    base_url = base_url.rstrip("/")
    taken_at = clock()
    started = time.monotonic()
    fetched = request(session, "GET", base_url + "/test_connection", timeout=timeout, max_bytes=_MAX_ANSWER)
    failed = _not_answered(taken_at, fetched, "/test_connection")
    if failed is not None:
        return failed
    if fetched.status != OK or _json(fetched) != "success":
        return Observation(taken_at, BLIND, error="/test_connection did not answer \"success\" (not a FastChat "
                                                  "controller?)", scrape_seconds=fetched.elapsed)
    fetched = request(session, "POST", base_url + "/list_models", timeout=max(0.1, timeout - fetched.elapsed),
                      max_bytes=_MAX_ANSWER)
    elapsed = time.monotonic() - started
    failed = _not_answered(taken_at, fetched, "/list_models")
    if failed is not None:
        return failed
    answer = _json(fetched)
    models = _names(answer.get("models")) if fetched.status == OK and isinstance(answer, dict) else None
    if models is None:
        return Observation(taken_at, BLIND, error=f"/list_models unusable ({fetched.error or 'no model list'})",
                           scrape_seconds=elapsed)
    return Observation(taken_at, ANSWERED, listed_models=tuple(sorted(models)), scrape_seconds=elapsed,
                       detail=f"controller answers; {len(models)} model(s) registered: "
                              f"{', '.join(sorted(models)) or 'none'}")


def api_models(message: str) -> tuple[str, ...] | None:
    """The models in FastChat's "Only a&&b allowed now, your model X" message, or None."""
    head, sep, _ = message.partition(" allowed now, your model ")
    if not sep or not head.startswith("Only "):
        return None
    names = head[len("Only "):]
    return tuple(sorted(name for name in names.split("&&") if name)) if names else ()


def observe_api(session: requests.Session, base_url: str, *, timeout: float, clock=time.monotonic) -> Observation:
    """A chat request naming a model that cannot exist: 400 with the registered models is an answer."""
    base_url = base_url.rstrip("/")
    taken_at = clock()
    body = {"model": UNKNOWN_MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    fetched = request(session, "POST", base_url + "/v1/chat/completions", timeout=timeout, max_bytes=_MAX_ANSWER,
                      json=body)
    failed = _not_answered(taken_at, fetched, "/v1/chat/completions")
    if failed is not None:
        if failed.status == TIMEOUT:
            failed = Observation(taken_at, TIMEOUT, error=f"{failed.error} (the API server, or the controller "
                                                          "it asks, is wedged)", scrape_seconds=failed.scrape_seconds)
        return failed
    answer = _json(fetched)
    if fetched.http_status == 401:
        return Observation(taken_at, ANSWERED, scrape_seconds=fetched.elapsed,
                           detail="API server answers (401: API keys are set; its controller is not checked)")
    if fetched.http_status == 400 and isinstance(answer, dict) and answer.get("code") == INVALID_MODEL:
        models = api_models(str(answer.get("message", "")))
        if models is not None:
            return Observation(taken_at, ANSWERED, listed_models=models, scrape_seconds=fetched.elapsed,
                               detail=f"API server and its controller answer; {len(models)} model(s) registered: "
                                      f"{', '.join(models) or 'none'}")
    if fetched.http_status is not None and fetched.http_status >= 500:
        return Observation(taken_at, BLIND, scrape_seconds=fetched.elapsed,
                           error=f"API server answers HTTP {fetched.http_status}: it cannot ask its controller")
    return Observation(taken_at, BLIND, scrape_seconds=fetched.elapsed,
                       error=f"an unknown model was not refused as FastChat does (HTTP {fetched.http_status}; "
                             "not a FastChat API server?)")
