"""Start, freeze, kill and load a real FastChat deployment (fschat 0.2.36, CPU) for the tests.

A controller, model workers and the OpenAI API server, each a process of the FastChat venv
listening on 127.0.0.1, with short heartbeat timings so registration and expiry happen in
seconds. Every process writes its output to its own log file, which the tests read (the
controller logs every registration, heartbeat and dispatch).

Standard library + ``requests`` only. Every process started here is stopped by PID in
:meth:`Fleet.stop` (a SIGSTOPped one is thawed first; SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import requests

CACHE = os.environ.get("HANGWATCH_CACHE", "/var/cache/hangwatch")
MODEL_NAME = "tiny-vicuna"
HEARTBEAT_INTERVAL = 2      # FASTCHAT_WORKER_HEART_BEAT_INTERVAL (default 45)
HEARTBEAT_EXPIRATION = 6    # FASTCHAT_CONTROLLER_HEART_BEAT_EXPIRATION (default 90)
WORKER_API_TIMEOUT = 20     # FASTCHAT_WORKER_API_TIMEOUT (default 100)


def _die_with_parent() -> None:
    """In the child before exec: killed when the test process dies, however it dies (SIGKILL:
    the controller's non-daemon heartbeat thread outlives a SIGTERM'd uvicorn)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def venv_path() -> str:
    return os.environ.get("HANGWATCH_FASTCHAT_VENV", os.path.join(CACHE, "fastchat-venv"))


def model_path() -> str:
    return os.environ.get("HANGWATCH_FASTCHAT_MODEL", os.path.join(CACHE, "fastchat-model", "tiny-vicuna"))


def python() -> str:
    return os.path.join(venv_path(), "bin", "python")


def venv_usable() -> bool:
    if not os.access(python(), os.X_OK):
        return False
    lib = os.path.join(venv_path(), "lib")
    return any(os.path.exists(os.path.join(lib, d, "site-packages", "fastchat", "serve", "model_worker.py"))
               for d in os.listdir(lib)) if os.path.isdir(lib) else False


def model_built() -> bool:
    return os.path.exists(os.path.join(model_path(), "hangwatch-model.json"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, what: str, step: float = 0.1):
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except requests.RequestException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g}s: {what}")
        time.sleep(step)


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@dataclass
class Server:
    """One FastChat process."""

    role: str
    port: int
    process: subprocess.Popen
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_size(self) -> int:
        return os.path.getsize(self.log_path)

    def log_since(self, offset: int) -> str:
        with open(self.log_path, errors="replace") as f:
            f.seek(offset)
            return f.read()

    def alive(self) -> bool:
        return self.process.poll() is None

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(lambda: proc_state(self.pid) == "T", 5, f"{self.role} stopped")

    def thaw(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if not self.alive():
            return
        self.thaw()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@dataclass
class Fleet:
    """A FastChat deployment on loopback; ``workers`` in start order."""

    workdir: str
    controller: Server | None = None
    api: Server | None = None
    workers: list[Server] = field(default_factory=list)
    extra_env: dict = field(default_factory=dict)

    def env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "FASTCHAT_WORKER_HEART_BEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
            "FASTCHAT_CONTROLLER_HEART_BEAT_EXPIRATION": str(HEARTBEAT_EXPIRATION),
            "FASTCHAT_WORKER_API_TIMEOUT": str(WORKER_API_TIMEOUT),
            "LOGDIR": self.workdir,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": os.path.join(self.workdir, "hf"),
            "TMPDIR": self.workdir,
            "OMP_NUM_THREADS": "1",     # 2-core machines: one thread per worker
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def _start(self, role: str, module: str, args: list[str], port: int) -> Server:
        log_path = os.path.join(self.workdir, f"{role}-{port}.out")
        with open(log_path, "ab") as out:
            process = subprocess.Popen([python(), "-m", module, *args], cwd=self.workdir, env=self.env(),
                                       stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent)
        return Server(role, port, process, log_path)

    def start_controller(self) -> Server:
        port = free_port()
        self.controller = self._start("controller", "fastchat.serve.controller",
                                      ["--host", "127.0.0.1", "--port", str(port)], port)
        wait_for(lambda: requests.get(self.controller.url + "/test_connection", timeout=2).ok, 60,
                 "controller answers /test_connection")
        return self.controller

    def start_worker(self, wait: bool = True, port: int | None = None, model_name: str = MODEL_NAME,
                     register: bool = True) -> Server:
        port = port or free_port()
        worker = self._start(f"worker{len(self.workers)}", "fastchat.serve.model_worker", [
            "--host", "127.0.0.1", "--port", str(port), "--worker-address", f"http://127.0.0.1:{port}",
            "--controller-address", self.controller.url, "--model-path", model_path(),
            "--model-names", model_name, "--device", "cpu", "--stream-interval", "1",
            *([] if register else ["--no-register"]),
        ], port)
        self.workers.append(worker)
        if wait:
            self.wait_worker_ready(worker, registered=register)
        return worker

    def wait_worker_ready(self, worker: Server, timeout: float = 120, registered: bool = True) -> None:
        def ready():
            if not worker.alive():
                raise RuntimeError(f"{worker.role} exited: {worker.log()[-2000:]}")
            return requests.post(worker.url + "/worker_get_status", timeout=2).ok
        wait_for(ready, timeout, f"{worker.role} answers /worker_get_status", step=0.3)
        if registered:
            wait_for(lambda: worker.url in self.controller.log(), timeout, f"{worker.role} registered")

    def start_api(self) -> Server:
        port = free_port()
        self.api = self._start("api", "fastchat.serve.openai_api_server", [
            "--host", "127.0.0.1", "--port", str(port), "--controller-address", self.controller.url,
        ], port)
        wait_for(lambda: requests.post(self.api.url + "/v1/chat/completions", json={}, timeout=2)
                 .status_code == 400, 60, "API server answers")
        return self.api

    def wait_heartbeat(self, worker: Server, timeout: float = 60) -> None:
        """Wait until the controller accepts a heartbeat of ``worker`` it knows (re-registered if dropped)."""
        offset = self.controller.log_size()
        wait_for(lambda: f"Receive heart beat. {worker.url}" in self.controller.log_since(offset), timeout,
                 f"controller receives a known heartbeat from {worker.role}")

    def queue_length(self, worker: Server) -> int:
        return requests.post(worker.url + "/worker_get_status", timeout=5).json()["queue_length"]

    def settle(self, timeout: float = 120) -> None:
        """Every live worker thawed, with an empty queue and registered at the controller."""
        live = [w for w in self.workers if w.alive()]
        for worker in live:
            worker.thaw()
        for worker in live:
            wait_for(lambda: self.queue_length(worker) == 0, timeout, f"{worker.role} idle", step=0.2)
        for worker in live:
            self.wait_heartbeat(worker, timeout)

    def registered_models(self) -> list[str]:
        """Side-effect free: the controller's /list_models."""
        return sorted(requests.post(self.controller.url + "/list_models", timeout=5).json()["models"])

    def servers(self) -> list[Server]:
        return [s for s in (self.api, *self.workers, self.controller) if s is not None]

    def stop(self) -> None:
        for server in self.servers():
            server.thaw()
        for server in self.servers():
            server.stop()


def start_fleet(n_workers: int = 2, workdir: str | None = None) -> Fleet:
    fleet = Fleet(workdir or tempfile.mkdtemp(prefix="hangwatch-fastchat-"))
    try:
        fleet.start_controller()
        started = [fleet.start_worker(wait=False) for _ in range(n_workers)]
        fleet.start_api()
        for worker in started:
            fleet.wait_worker_ready(worker)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def generate_stream(worker_url: str, max_new_tokens: int, timeout: float = 300):
    """A long generation sent straight to a worker (as the API server would); returns the response."""
    body = {"model": MODEL_NAME, "prompt": "count", "temperature": 0.7, "max_new_tokens": max_new_tokens,
            "echo": False}
    return requests.post(worker_url + "/worker_generate_stream", json=body, stream=True, timeout=timeout)
