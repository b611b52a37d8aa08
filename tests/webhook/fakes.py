"""Fakes for the webhook's collaborators: a Docker client that records calls, a clock, a re-checker.

The re-checker returns the verdict core's own types (``CheckResult``, ``Verdict``,
``Observation``, ``Reading``), so the webhook is exercised against what ``check()`` returns.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import requests
from docker.errors import NotFound

from hangwatch.check import CheckResult
from hangwatch.observe import Observation
from hangwatch.reading import Reading
from hangwatch.verdict import Verdict

TOKEN = "s3cret-token-for-tests-0123456789"


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
    def __init__(self, docker: "FakeDocker", name: str, started: float):
        self.docker = docker
        self.name = name
        self.id = f"{abs(hash(name)):064x}"[:64]
        self.attrs = {"State": {"Status": "running", "Running": True, "Restarting": False, "Paused": False,
                                "StartedAt": iso(started)}}

    def restart(self, timeout=None):
        with self.docker.lock:
            self.docker.restarts.append((self.name, timeout))
            self.attrs["State"]["StartedAt"] = iso(self.docker.clock() + 0.001)

    def logs(self, tail=None, timestamps=False):
        return "".join(f"line {i} of {self.name}\n" for i in range(150)).encode()


class _Containers:
    def __init__(self, docker: "FakeDocker"):
        self.docker = docker

    def get(self, name):
        docker = self.docker
        with docker.lock:
            docker.gets.append(name)
        if docker.delay:
            time.sleep(docker.delay)
        if docker.down:
            raise requests.exceptions.ConnectionError("Connection aborted: FileNotFoundError(2)")
        with docker.lock:
            container = docker.by_name.get(name)
        if container is None:
            raise NotFound(f"No such container: {name}")
        return container


class FakeDocker:
    """Records every lookup (``gets``) and every restart (``restarts``)."""

    def __init__(self, clock, names=("vllm-a", "vllm-b"), started: float | None = None):
        self.clock = clock
        self.lock = threading.Lock()
        self.gets: list[str] = []
        self.restarts: list[tuple[str, int]] = []
        self.down = False
        self.delay = 0.0
        start = clock() - 3600 if started is None else started
        self.by_name = {name: FakeContainer(self, name, start) for name in names}
        self.containers = _Containers(self)


def result(state: str = "hung", reason: str | None = None, running: float = 1) -> CheckResult:
    reading = Reading(engine="vllm", running=running, waiting=0, steps=42, generation_tokens=7)
    observations = tuple(Observation(taken_at=float(i), status="ok", reading=reading) for i in range(3))
    return CheckResult(Verdict(state, reason or f"fake {state}"), "backend", observations)


class FakeRechecker:
    """Answers a fixed verdict; can block on an event to keep a job 'running'."""

    def __init__(self, state: str = "hung"):
        self.state = state
        self.calls: list[dict] = []
        self.gate: threading.Event | None = None
        self.lock = threading.Lock()

    def __call__(self, url, *, module, interval, timeout, api_key=None, probe="auto"):
        with self.lock:
            self.calls.append({"url": url, "module": module, "interval": interval, "timeout": timeout,
                               "api_key": api_key, "probe": probe})
        if self.gate is not None:
            assert self.gate.wait(10), "test never released the re-check"
        if isinstance(self.state, Exception):
            raise self.state
        return result(self.state)


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
