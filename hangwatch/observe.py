"""Take one observation of a backend: its /metrics, read, and — only at idle — the probe.

Every caller (``hangwatch check``, the exporter's scrape, the webhook's re-check) observes a
backend through this one function, so the rule "never probe while anything is in flight"
lives in exactly one place.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import requests

from .fetch import OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE, request
from .probe import ProbeResult, send_probe
from .reading import Reading, UnreadablePage, parse

# Observation status: how the backend answered.
ANSWERED, BLIND = "ok", "blind"


@dataclass(frozen=True)
class Observation:
    taken_at: float                  # time.monotonic() when the reading was taken
    status: str                      # ok | blind | refused | unreachable | timeout
    reading: Reading | None = None
    error: str = ""
    probe: ProbeResult | None = None
    scrape_seconds: float = 0.0
    detail: str = ""                 # what a target without a load reading said (a controller)
    listed_models: tuple[str, ...] | None = None  # models a fleet's front lists as registered

    @property
    def answered(self) -> bool:
        """The server answered HTTP at all (even if the page was unusable)."""
        return self.status in (ANSWERED, BLIND)

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "detail": self.detail,
            "listed_models": None if self.listed_models is None else list(self.listed_models),
            "reading": self.reading.as_dict() if self.reading else None,
            "probe": None if self.probe is None else
            {"success": self.probe.success, "duration": self.probe.duration, "detail": self.probe.detail},
        }


def observe_backend(session: requests.Session, base_url: str, *, timeout: float,
                    probe_timeout: float | None = None, engine: str | None = None,
                    allow_probe: bool = True, clock=time.monotonic) -> Observation:
    """Read ``base_url``/metrics once; probe only if the reading shows nothing in flight.

    Without a ``probe_timeout`` the probe gets what is left of ``timeout`` after the read:
    /metrics answers in milliseconds, so a short scrape budget still leaves the probe time.
    """
    base_url = base_url.rstrip("/")
    taken_at = clock()
    fetched = request(session, "GET", base_url + "/metrics", timeout=timeout)
    if fetched.status in (REFUSED, UNREACHABLE, TIMEOUT):
        return Observation(taken_at, fetched.status, error=fetched.error, scrape_seconds=fetched.elapsed)
    if fetched.status == TOO_LARGE:
        return Observation(taken_at, BLIND, error=f"/metrics {fetched.error}", scrape_seconds=fetched.elapsed)
    if fetched.status != OK:
        return Observation(taken_at, BLIND, error=f"/metrics answered {fetched.error}", scrape_seconds=fetched.elapsed)
    try:
        reading = parse(fetched.text, engine)
    except UnreadablePage as exc:
        return Observation(taken_at, BLIND, error=f"/metrics unusable: {exc}", scrape_seconds=fetched.elapsed)
    probe = None
    if allow_probe and reading.in_flight == 0 and not reading.asleep:
        probe = send_probe(session, base_url, probe_timeout or max(0.1, timeout - fetched.elapsed))
    return Observation(taken_at, ANSWERED, reading=reading, probe=probe, scrape_seconds=fetched.elapsed)


def observe_proxy(session: requests.Session, base_url: str, *, timeout: float, clock=time.monotonic) -> Observation:
    """A proxy is asked only for /v1/models: its /metrics would mix many backends."""
    taken_at = clock()
    fetched = request(session, "GET", base_url.rstrip("/") + "/v1/models", timeout=timeout, max_bytes=1 << 20)
    if fetched.status in (REFUSED, UNREACHABLE, TIMEOUT):
        return Observation(taken_at, fetched.status, error=fetched.error, scrape_seconds=fetched.elapsed)
    if fetched.status != OK:
        return Observation(taken_at, BLIND, error=f"/v1/models answered {fetched.error}", scrape_seconds=fetched.elapsed)
    return Observation(taken_at, ANSWERED, scrape_seconds=fetched.elapsed)
