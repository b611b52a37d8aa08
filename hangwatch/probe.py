"""The tiny idle probe: one 1-token completion (or one embedding), sent only when nothing is in flight.

An engine can wedge while its gauges read 0, so at idle, where it costs nothing, it is asked
for an answer (``observe.observe_load`` holds the "only at idle" rule). Only a failed probe
(no answer in time, broken, 5xx) counts toward hung; a rejected one (4xx: no API key, a model
that cannot do it) proves nothing about the engine. ``Options.probe`` picks what is asked;
``auto`` is a completion, or one embedding when the server has no completions route for it.
"""
from __future__ import annotations

import json

from .client import Client, Fetched
from .deadline import Deadline
from .models_memo import ModelMemo
from .observation import (
    HTTP_ERROR,
    OK,
    PROBE_ANSWERED,
    PROBE_AUTO,
    PROBE_COMPLETION,
    PROBE_EMBEDDING,
    PROBE_FAILED,
    PROBE_REJECTED,
    TOO_LARGE,
    Options,
    ProbeResult,
)

MAX_ANSWER = 1 << 20
_NO_SUCH_ROUTE = (404, 405)


def outcome_of(fetched: Fetched) -> str:
    """answered, failed or rejected — the one place an HTTP ending becomes a probe outcome."""
    if fetched.status == OK:
        return PROBE_ANSWERED
    if fetched.status in (HTTP_ERROR, TOO_LARGE) and fetched.http_status is not None \
            and 400 <= fetched.http_status < 500:
        return PROBE_REJECTED
    return PROBE_FAILED  # timeout, stalled, refused, broken, 5xx, an oversized answer


def advice(status: int | None, what: str, keyed: bool = False) -> str:
    """What a person can do about a rejected probe (never contains the key itself); ``keyed``: a key was sent."""
    if status == 401 and keyed:
        return (f"{what} was rejected with HTTP 401: the server rejected the API key hangwatch sent "
                "(is --api-key-file / api_key_file the key the server was started with?)")
    if status == 401:
        return (f"{what} was rejected with HTTP 401: give hangwatch the server's API key "
                "(--api-key-file / api_key_file)")
    if status == 403:
        return f"{what} was rejected with HTTP 403: the API key given to hangwatch is not allowed to call it"
    if status in _NO_SUCH_ROUTE:
        return (f"{what} was rejected with HTTP {status}: the server has no such route for this model "
                "(set probe: embedding, completion or none for this target)")
    if status == 429:
        return f"{what} was rejected with HTTP 429: the server is rate limiting hangwatch"
    return f"{what} was rejected with HTTP {status}: the API server refused it before the engine saw it"


def _result(fetched: Fetched, what: str, kind: str, model: str | None, keyed: bool = False) -> ProbeResult:
    outcome = outcome_of(fetched)
    if outcome == PROBE_ANSWERED:
        detail = f"{what} answered in {fetched.elapsed * 1000:.0f} ms"
    elif outcome == PROBE_REJECTED:
        detail = advice(fetched.http_status, what, keyed)
    else:
        detail = f"{what}: {fetched.error}"
    return ProbeResult(outcome, fetched.elapsed, detail, model, kind, fetched.http_status)


async def first_model(client: Client, base_url: str, deadline: Deadline,
                options: Options) -> tuple[str | None, ProbeResult | None]:
    """The first model id in /v1/models, or None and the probe's ending (rejected or failed)."""
    fetched = await client.request("GET", base_url + "/v1/models", deadline=deadline, max_bytes=MAX_ANSWER,
                             headers=options.auth_headers())
    if fetched.status != OK:
        return None, _result(fetched, "/v1/models", PROBE_COMPLETION, None, bool(options.api_key))
    try:
        models = [entry["id"] for entry in json.loads(fetched.body)["data"]]
    except (ValueError, KeyError, TypeError):
        return None, ProbeResult(PROBE_REJECTED, fetched.elapsed, "/v1/models is not an OpenAI model list: "
                                 "set probe: none for this target", http_status=fetched.http_status)
    if not models or not isinstance(models[0], str):
        return None, ProbeResult(PROBE_REJECTED, fetched.elapsed, "/v1/models lists no model: nothing to probe",
                                 http_status=fetched.http_status)
    return models[0], None


async def send_probe(client: Client, base_url: str, deadline: Deadline, options: Options = Options(), *,
                     known: ModelMemo | None = None, started: float | None = None) -> ProbeResult:
    """Ask the idle engine for one token (or one embedding) before ``deadline``. ``known``: the
    models remembered per process (``started``: this process's start time); without it the
    model is asked from /v1/models every time (the CLI's one-off check)."""
    model = known.model(base_url, started) if known is not None else None
    if model is None:
        model, ended = await first_model(client, base_url, deadline, options)
        if model is None:
            return ended
        if known is not None:
            known.remember(base_url, started, model)
    unknown = False  # the server said the model does not exist
    if options.probe == PROBE_EMBEDDING:
        fetched, result = await _embedding(client, base_url, deadline, options, model)
    else:
        body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
        fetched = await client.request("POST", base_url + "/v1/completions", deadline=deadline,
                                       max_bytes=MAX_ANSWER, json=body, headers=options.auth_headers())
        result = _result(fetched, "1-token completion", PROBE_COMPLETION, model, bool(options.api_key))
        if options.probe == PROBE_AUTO and result.rejected and fetched.http_status in _NO_SUCH_ROUTE:
            unknown = no_such_model(fetched)
            fetched, result = await _embedding(client, base_url, deadline, options, model)  # pooling (vLLM: 404)
    if known is not None and (unknown or no_such_model(fetched)):
        known.forget(base_url)  # remembered wrongly, or the server dropped it: ask next time
    return result


def no_such_model(fetched: Fetched) -> bool:
    """The server answered that the model named does not exist (vLLM: 404, "The model `x` does
    not exist."), not that the route does not (a pooling model's 404 ``{"detail":"Not Found"}``)."""
    return fetched.http_status == 404 and b"does not exist" in fetched.body


async def _embedding(client: Client, base_url: str, deadline: Deadline, options: Options,
                     model: str) -> tuple[Fetched, ProbeResult]:
    body = {"model": model, "input": "ping"}
    fetched = await client.request("POST", base_url + "/v1/embeddings", deadline=deadline, max_bytes=MAX_ANSWER,
                                   json=body, headers=options.auth_headers())
    return fetched, _result(fetched, "1-input embedding", PROBE_EMBEDDING, model, bool(options.api_key))
