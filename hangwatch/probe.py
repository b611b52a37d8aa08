"""The tiny idle probe: one 1-token completion, sent only when nothing is in flight.

An engine can wedge while its gauges read 0 (a request sent during a freeze never shows up
as waiting), so at idle — and only at idle, where it costs nothing — we ask for a response.
While anything is in flight the probe would queue behind real work and prove nothing, so
the callers never send it then (see ``observe``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import requests

from .fetch import OK, request


@dataclass(frozen=True)
class ProbeResult:
    success: bool
    duration: float
    detail: str
    model: str | None = None


def first_model(session: requests.Session, base_url: str, timeout: float) -> tuple[str | None, str]:
    """The first model id in /v1/models, or None and why not."""
    fetched = request(session, "GET", base_url + "/v1/models", timeout=timeout, max_bytes=1 << 20)
    if fetched.status != OK:
        return None, f"/v1/models: {fetched.error}"
    try:
        models = [entry["id"] for entry in json.loads(fetched.body)["data"]]
    except (ValueError, KeyError, TypeError):
        return None, "/v1/models: not an OpenAI model list"
    if not models:
        return None, "/v1/models lists no model"
    return str(models[0]), ""


def send_probe(session: requests.Session, base_url: str, timeout: float) -> ProbeResult:
    """Ask the idle engine for one token; success means it answered within ``timeout``."""
    model, why = first_model(session, base_url, timeout)
    if model is None:
        return ProbeResult(False, 0.0, why)
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    fetched = request(session, "POST", base_url + "/v1/completions", timeout=timeout, max_bytes=1 << 20, json=body)
    if fetched.status != OK:
        return ProbeResult(False, fetched.elapsed, f"1-token completion: {fetched.error}", model)
    return ProbeResult(True, fetched.elapsed, f"1-token completion answered in {fetched.elapsed * 1000:.0f} ms", model)

