"""``/livez`` and ``/readyz``: a kubelet's questions about one backend, answered in time.

``GET /livez?target=URL&module=MODULE`` is 503 only when the bounded check
(``hangwatch.liveness``) says ``hung``, else 200; ``GET /readyz?...`` is 200 only when the
backend can take work now. Both are answered from the same check: concurrent calls for one
target and module — several kubelets, a liveness and a readiness probe landing together, a
router asking too — share one check instead of each sending its own idle probe, and no
second check of a target starts while one is still running. Nothing is kept once a check
has answered, so two exporters (or a restarted one) answer alike.

The target is validated and held to ``allow_targets`` exactly as ``/probe`` is (400, 403):
the exporter is not an open relay. The body is one JSON object (the check's own
``hangwatch check --json`` fields plus the decision), for people and routers; a kubelet
reads only the status.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import parse_qs

from prometheus_client import Counter

from hangwatch import liveness
from hangwatch.liveness import Bounded, StartupClock
from hangwatch.modules import MODULES as OBSERVERS
from hangwatch.settings import ConfigError, http_url

from .config import ExporterConfig

log = logging.getLogger("hangwatch.exporter")

ANSWERS = Counter("hangwatch_exporter_health_answers", "Answers of /livez and /readyz, by endpoint and HTTP code.",
                  ["endpoint", "code"])
CHECKS = Counter("hangwatch_exporter_health_checks", "Bounded checks started for /livez and /readyz "
                 "(fewer than answers when concurrent calls share one).")

JSON = "application/json"


@dataclass
class _Running:
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Bounded | None = None


class SharedChecks:
    """At most one bounded check per (target, module) at a time; callers meanwhile share it."""

    def __init__(self, run: Callable[[str, str], Bounded], budget: float,
                 clock: Callable[[], float] = time.monotonic, startup: StartupClock | None = None):
        self._run, self._budget, self._clock = run, budget, clock
        self.startup = startup  # with startup_deadline: how long each target has been down
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], _Running] = {}

    def result(self, target: str, module: str) -> tuple[Bounded | None, bool]:
        """The check's outcome (None: not finished by its deadline) and whether it was shared."""
        key = (target, module)
        with self._lock:
            running = self._running.get(key)
            shared = running is not None
            if running is None:
                running = self._running[key] = _Running(self._clock() + self._budget)
                CHECKS.inc()
                threading.Thread(target=self._check, args=(key, running), daemon=True,
                                 name=f"hangwatch-livez-{target}").start()
        running.done.wait(max(0.0, running.deadline - self._clock()))
        return running.outcome, shared

    def _check(self, key: tuple[str, str], running: _Running) -> None:
        try:
            running.outcome = self._run(*key)
        except Exception:  # noqa: BLE001 - a broken check is "no verdict", never a crashed answer
            log.exception("bounded check of %s failed", key[0])
        finally:
            with self._lock:
                del self._running[key]
            running.done.set()


def shared_checks(config: ExporterConfig) -> SharedChecks:
    def run(target: str, module: str) -> Bounded:
        options = config.options_for(target)  # the target's own API key and probe kind, as /probe
        return liveness.bounded_check(target, module=module, interval=config.liveness_interval,
                                      timeout=config.liveness_timeout, budget=config.liveness_budget,
                                      api_key=options.api_key, probe=options.probe)
    startup = StartupClock(config.startup_deadline) if config.startup_deadline else None
    return SharedChecks(run, config.liveness_budget, startup=startup)


def validated(query: str, config: ExporterConfig) -> tuple[int, str, str]:
    """(0, target, module) for a good request; else (HTTP code, message, "")."""
    params = parse_qs(query, keep_blank_values=True)
    targets, modules = params.get("target", []), params.get("module", ["backend"])
    if len(targets) != 1 or len(modules) != 1:
        return 400, "exactly one target= (and at most one module=) is required", ""
    module = modules[0] or "backend"
    if module not in OBSERVERS:
        return 400, f"unknown module {module!r} (known: {', '.join(OBSERVERS)})", ""
    try:
        target = http_url(targets[0], "target")
    except ConfigError as exc:
        return 400, str(exc), ""
    if not config.allows(target):
        return 403, "target is not in the exporter's allow_targets", ""
    return 0, target, module


def answer_health(endpoint: str, query: str, config: ExporterConfig, checks: SharedChecks) -> tuple[int, str, bytes]:
    """``endpoint`` is ``livez`` or ``readyz``: (HTTP code, content type, body)."""
    code, target, module = validated(query, config)
    if code:
        ANSWERS.labels(endpoint, str(code)).inc()
        return code, "text/plain", f"{target}\n".encode()
    started = time.monotonic()
    outcome, shared = checks.result(target, module)
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
