"""The modules a target can be checked with, and how each one observes its target.

A module decides which endpoints are read and nothing else: ``backend`` reads an engine's
/metrics (and probes at idle), ``proxy`` only asks /v1/models. Every caller — the check
command, the exporter and the webhook's re-check — looks modules up here, so a new kind of
target (the FastChat ones) is one entry, not three edits.
"""
from __future__ import annotations

from typing import Callable

from . import fastchat
from .observe import Observation, observe_backend, observe_proxy

# An observer: (session, url, *, timeout, probe_timeout, engine, clock) -> Observation
Observer = Callable[..., Observation]


def _proxy(session, url, *, timeout, probe_timeout=None, engine=None, clock):
    return observe_proxy(session, url, timeout=timeout, clock=clock)


def _backend(session, url, *, timeout, probe_timeout=None, engine=None, clock):
    return observe_backend(session, url, timeout=timeout, probe_timeout=probe_timeout, engine=engine, clock=clock)


def _fastchat_worker(session, url, *, timeout, probe_timeout=None, engine=None, clock):
    return fastchat.observe_worker(session, url, timeout=timeout, probe_timeout=probe_timeout, clock=clock)


def _fastchat_controller(session, url, *, timeout, probe_timeout=None, engine=None, clock):
    return fastchat.observe_controller(session, url, timeout=timeout, clock=clock)


def _fastchat_api(session, url, *, timeout, probe_timeout=None, engine=None, clock):
    return fastchat.observe_api(session, url, timeout=timeout, clock=clock)


OBSERVERS: dict[str, Observer] = {
    "backend": _backend,
    "proxy": _proxy,
    "fastchat_worker": _fastchat_worker,
    "fastchat_controller": _fastchat_controller,
    "fastchat_api": _fastchat_api,
}
# Modules whose targets are never restarted (a proxy or controller down is for people).
NEVER_RESTARTED = frozenset({"proxy", "fastchat_controller", "fastchat_api"})
# Modules that read a load reading (in flight, progress): they report metrics_available.
READS_LOAD = frozenset({"backend", "fastchat_worker"})


def observer_for(module: str) -> Observer:
    try:
        return OBSERVERS[module]
    except KeyError:
        raise ValueError(f"unknown module {module!r} (known: {', '.join(OBSERVERS)})") from None
