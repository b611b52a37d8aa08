"""Real parts for the webhook's tests: a Docker host, a local image, fake-vLLM containers,
``hangwatch webhook`` processes and an Alertmanager. Each fixture stops what it started.

Docker: if ``docker info`` does not answer, ``.ci/start-dockerd.sh`` starts one (no
bridge, no iptables) and ``.ci/stop-dockerd.sh`` stops it at the end of the session. The
image is made here with ``docker import`` (no registry): an empty root with /lib, /bin
symlinks into /usr, and the host's /usr bind-mounted read-only, so the host's
/usr/bin/python3 runs ``fake_backend.py`` with ``--network host --init``.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import time
import uuid
from datetime import datetime, timezone

import pytest
import requests

from hangwatch.demo.files import private_file
from hangwatch.demo.processes import listening_ports, stop_popen
from hangwatch.demo.wait import wait_until
from harness.ports import address_in_use, free_port
from tests.support.require import require, require_binary

REPO = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
IMAGE = "hangwatch-webhook-test:latest"
REAL_TOKEN = "real-test-token-0123456789-0123456789"
HOST_PYTHON = "/usr/bin/python3"


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """``hangwatch.demo.wait.wait_until`` under the name these tests use."""
    return wait_until(predicate, timeout, what, interval=interval)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=0.5).status_code == 200
    except requests.RequestException:
        return False


def _dockerd_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def dockerd():
    """A Docker host answering on the default socket; started (and stopped) here if needed."""
    require_binary("docker")
    if _dockerd_answers():
        yield
        return
    require_binary("dockerd")
    require(os.geteuid() == 0, "root, to run dockerd")
    started = subprocess.run([str(REPO / ".ci" / "start-dockerd.sh")], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield
    finally:
        subprocess.run([str(REPO / ".ci" / "stop-dockerd.sh")], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def docker_client(dockerd):
    import docker
    client = docker.from_env(timeout=60)
    yield client
    client.close()


def image_tar() -> bytes:
    """The test image's root: empty directories and /lib, /bin symlinks into the host's /usr."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("usr", "tmp", "proc", "sys", "dev", "etc", "sbin", "app", "mode"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name in ("lib", "lib64", "bin"):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{name}"
            tar.addfile(info)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def backend_image(docker_client):
    require(os.path.exists(HOST_PYTHON), f"{HOST_PYTHON} (the host's Python, bind-mounted into the test image)")
    made = subprocess.run(["docker", "import", "-", IMAGE], input=image_tar(), capture_output=True, timeout=60)
    assert made.returncode == 0, made.stderr.decode(errors="replace")
    yield IMAGE
    try:
        docker_client.images.remove(IMAGE, force=True)
    except Exception:
        pass


class Backend:
    """One fake-vLLM container; ``mode`` flips hung/busy/idle; ``restarts()`` counts Docker's restart events.

    It must keep its port across restarts (the webhook's config names its URL), so it is given a
    free port, and made again on another when that one was taken before it bound it."""

    def __init__(self, client, image, directory: pathlib.Path, ignore_sigterm: bool = False, name: str | None = None,
                 say: str | None = None, wait: bool = True, never_listen: bool = False, mirror: str | None = None):
        self.client = client
        self.name = name or f"hw-test-{uuid.uuid4().hex[:8]}"
        for attempt in range(1, 6):
            self._run(image, directory, ignore_sigterm, say, never_listen, mirror)
            if not wait or never_listen:
                return  # the caller waits (or nothing listens, by design)
            try:
                self.wait_ready()
                return
            except AssertionError:
                clash = address_in_use(self.logs())
                self.remove()
                if attempt == 5 or not clash:
                    raise

    def _run(self, image, directory: pathlib.Path, ignore_sigterm: bool, say: str | None,
             never_listen: bool, mirror: str | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mode_dir = directory / f"{self.name}-{self.port}"
        self.mode_dir.mkdir(parents=True)
        self.set_mode("hung")
        self.created = int(time.time()) - 1
        self.container = self.client.containers.run(
            image, [HOST_PYTHON, "/app/fake_backend.py", str(self.port), "/mode/mode",
                    *(["--ignore-sigterm"] if ignore_sigterm else []), *(["--say", say] if say else []),
                    *(["--never-listen"] if never_listen else []),
                    *(["--mirror", "/mirror/" + os.path.basename(mirror)] if mirror else [])],
            name=self.name,
            detach=True, init=True, network_mode="host",
            volumes={"/usr": {"bind": "/usr", "mode": "ro"}, str(HERE): {"bind": "/app", "mode": "ro"},
                     str(self.mode_dir): {"bind": "/mode", "mode": "ro"},
                     **({os.path.dirname(mirror): {"bind": "/mirror", "mode": "ro"}} if mirror else {})})

    def set_mode(self, mode: str) -> None:
        (self.mode_dir / "mode").write_text(mode)

    def started_at(self) -> str:
        self.container.reload()
        return self.container.attrs["State"]["StartedAt"]

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def wait_ready(self, timeout: float = 20) -> None:
        """Until this container's own server answers /metrics: an answer on its port from
        anyone else (a port taken before it bound it) is not its readiness."""
        def ready():
            self.container.reload()
            if self.container.status in ("exited", "dead"):
                raise AssertionError(f"{self.name} {self.container.status}:\n{self.logs()[-2000:]}")
            server = self._server_pid()
            return server is not None and answers(self.url + "/metrics") and self.port in listening_ports(server)
        wait_for(ready, timeout, f"{self.name}'s own server to answer /metrics on {self.port}")

    def _server_pid(self) -> int | None:
        """The fake backend's process: the one child of the container's init (None: not yet)."""
        init = self.container.attrs["State"]["Pid"]
        try:
            with open(f"/proc/{init}/task/{init}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            return None
        return children[0] if len(children) == 1 else None

    def restarts(self) -> int:
        events = self.client.events(since=self.created, until=int(time.time()) + 1, decode=True,
                                    filters={"container": self.name, "event": "restart"})
        return sum(1 for _ in events)

    def remove(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception:
            pass


@pytest.fixture
def backend(docker_client, backend_image, tmp_path):
    made = []

    def make(mode: str = "hung", ignore_sigterm: bool = False, say: str | None = None, wait: bool = True) -> Backend:
        made.append(Backend(docker_client, backend_image, tmp_path / "backends", ignore_sigterm, say=say, wait=wait))
        made[-1].set_mode(mode)
        return made[-1]

    yield make
    for item in made:
        item.remove()


def webhook_config(tmp_path: pathlib.Path, backends, *, state_dir=None, cooldown="15m", restarts=3,
                   interval="300ms", stop_timeout="5s", containers=None) -> pathlib.Path:
    token = private_file(tmp_path / "token", REAL_TOKEN + "\n")
    config = {
        "token_file": str(token), "state_dir": str(state_dir or tmp_path / "state"),
        "recheck": {"interval": interval, "timeout": "1s"}, "cooldown": cooldown,
        "budget": {"restarts": restarts, "window": "1h"},
        "targets": [{"name": b.name, "container": (containers or {}).get(b.name, b.name), "url": b.url,
                     "stop_timeout": stop_timeout} for b in backends],
    }
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


class WebhookProcess:
    """``hangwatch webhook`` as a real process on loopback port 0: the port it bound is read from
    /proc, and it is ready when it answers /healthz itself (on a port guessed free, anyone who
    took it meanwhile answered for it, or it failed to bind and the test met someone else)."""

    def __init__(self, config: pathlib.Path, log_path: pathlib.Path, *extra: str, env: dict | None = None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hangwatch", "webhook", "--config", str(config), "--listen",
             "127.0.0.1:0", *extra], cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})

        def listening():
            assert self.process.poll() is None, self.log()
            ports = listening_ports(self.process.pid)
            return ports[0] if len(ports) == 1 else None
        try:
            self.port = wait_for(listening, 20, "the webhook to listen")
            self.url = f"http://127.0.0.1:{self.port}"
            wait_for(lambda: self.process.poll() is None and answers(self.url + "/healthz"), 20, "webhook /healthz")
        except BaseException:
            self.stop()
            raise

    def idle(self) -> bool:
        return requests.get(self.url + "/healthz", timeout=2).json()["jobs_in_progress"] == 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_popen(self.process, 30)
        self._log.close()


def ledger(state_dir: pathlib.Path) -> list[dict]:
    path = state_dir / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alert_body(backend: Backend, starts_at: str | None = None, status: str = "firing") -> dict:
    return {"version": "4", "status": status, "receiver": "hangwatch", "groupLabels": {}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://127.0.0.1:9093", "groupKey": "{}", "truncatedAlerts": 0,
            "alerts": [{"status": status, "labels": {"alertname": "HangwatchBackendHung", "target": backend.name,
                                                     "container": backend.name, "severity": "critical",
                                                     "action": "restart"},
                        "annotations": {}, "startsAt": starts_at or now_rfc3339(),
                        "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "0"}]}
