"""Fakes for the webhook's collaborators: a restarter that records calls, a clock, a re-checker.

The re-checker returns the verdict core's own types (``CheckResult``, ``Verdict``,
``Observation``, ``Reading``), so the webhook is exercised against what ``check()`` returns.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

from hangwatch.check import CheckResult
from hangwatch.observe import Observation
from hangwatch.reading import Reading
from hangwatch.verdict import Verdict
from hangwatch.webhook.restarter import Container, ContainerNotFound, DockerError, container_from_inspect

TOKEN = "s3cret-token-for-tests-0123456789"  # 33 characters: the webhook wants at least 32


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


class FakeClock:
    """Wall time that moves only when told (thread-safe)."""

    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FakeContainer:
    """One container as Docker's inspect answer describes it (``attrs``, mutable by tests)."""

    def __init__(self, host: "FakeRestarter", name: str, started: float):
        self.host = host
        self.name = name
        self.id = f"{abs(hash(name)):064x}"[:64]
        self.attrs = {"Id": self.id, "Name": "/" + name,
                      "State": {"Status": "running", "Running": True, "Restarting": False, "Paused": False,
                                "StartedAt": iso(started)}}

    @property
    def state(self) -> dict:
        return self.attrs["State"]


class FakeRestarter:
    """A ``Restarter`` over fake containers; records every lookup (``gets``) and restart (``restarts``).
    ``down`` makes the Docker host unreachable, ``delay`` slow; ``restart_gate`` holds a restart until set."""

    def __init__(self, clock, names=("vllm-a", "vllm-b"), started: float | None = None):
        self.clock = clock
        self.lock = threading.Lock()
        self.gets: list[str] = []
        self.restarts: list[tuple[str, float]] = []
        self.down = False
        self.delay = 0.0
        self.restart_gate: threading.Event | None = None
        self.restart_started = threading.Event()
        start = clock() - 3600 if started is None else started
        self.by_name = {name: FakeContainer(self, name, start) for name in names}

    def find(self, name: str) -> Container:
        with self.lock:
            self.gets.append(name)
        if self.delay:
            time.sleep(self.delay)
        if self.down:
            raise DockerError("ConnectionError: Connection aborted: FileNotFoundError(2)")
        with self.lock:
            container = self.by_name.get(name)
            if container is None:
                raise ContainerNotFound(name)
            return container_from_inspect(container.attrs)

    def restart(self, container: Container, stop_timeout: float) -> None:
        self.restart_started.set()
        if self.restart_gate is not None:
            assert self.restart_gate.wait(10), "test never released the restart"
        with self.lock:
            fake = next(c for c in self.by_name.values() if c.id == container.id)
            self.restarts.append((fake.name, stop_timeout))
            fake.state["StartedAt"] = iso(self.clock() + 0.001)

    def log_tail(self, container: Container, lines: int) -> list[str]:
        return [f"line {i} of {container.name}" for i in range(150)][-lines:]


def result(state: str = "hung", reason: str | None = None, running: float = 1,
           process_start: float | None = None) -> CheckResult:
    reading = Reading(engine="vllm", running=running, waiting=0, steps=42, generation_tokens=7,
                      process_start=process_start)
    observations = tuple(Observation(taken_at=float(i), status="ok", reading=reading) for i in range(3))
    return CheckResult(Verdict(state, reason or f"fake {state}"), "backend", observations)


class FakeRechecker:
    """Answers a fixed verdict (``by_url`` overrides it per backend URL); can block on an event
    to keep a job 'running'."""

    def __init__(self, state: str = "hung"):
        self.state = state
        self.by_url: dict[str, str] = {}
        self.calls: list[dict] = []
        self.gate: threading.Event | None = None
        self.process_start: float | None = None  # the readings' process start time
        self.lock = threading.Lock()

    def __call__(self, url, *, module, interval, timeout, api_key=None, probe="auto", stall_window=None):
        with self.lock:
            call = {"url": url, "module": module, "interval": interval, "timeout": timeout,
                    "api_key": api_key, "probe": probe}
            if stall_window is not None:
                call["stall_window"] = stall_window
            self.calls.append(call)
        if self.gate is not None:
            assert self.gate.wait(10), "test never released the re-check"
        state = self.by_url.get(url, self.state)
        if isinstance(state, Exception):
            raise state
        return result(state, process_start=self.process_start)


def alert(*, status="firing", alertname="HangwatchBackendHung", target="vllm-a", container="vllm-a",
          starts_at: str | None = None, **labels) -> dict:
    all_labels = {"alertname": alertname, "severity": "critical", "action": "restart", **labels}
    if target is not None:
        all_labels["target"] = target
    if container is not None:
        all_labels["container"] = container
    return {"status": status, "labels": all_labels, "annotations": {"summary": "hung"},
            "startsAt": starts_at or "2026-11-30T03:00:00.123456789Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://127.0.0.1:9090/graph", "fingerprint": "abc"}


def payload(*alerts: dict, version: str = "4") -> dict:
    return {"version": version, "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "hangwatch", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://127.0.0.1:9093", "alerts": list(alerts)}


def auth(token: str = TOKEN) -> dict:
    return {"Authorization": f"Bearer {token}"}
