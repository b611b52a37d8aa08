"""Start, freeze, kill and load a real FastChat deployment (fschat 0.2.36, CPU) for the tests.

A controller, model workers and the OpenAI API server, each a process of the FastChat venv
listening on 127.0.0.1, with short heartbeat timings so registration and expiry happen in
seconds. Every process writes its output to its own log file, which the tests read (the
controller logs every registration, heartbeat and dispatch).

The controller and the API server bind port 0 (the port is read back). A worker must announce
its own address before it binds, so it gets a free port and is started again on another
when that port was taken meanwhile (after the controller dropped the dead registration).
Every process is stopped by PID in :meth:`Fleet.stop` (thawed first; SIGTERM, then SIGKILL).
:func:`fleet_stack` watches the deployment with the one Prometheus + Alertmanager stack.
"""
from __future__ import annotations

import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import requests

from hangwatch.demo.processes import Process, ProcessExited, listening_ports
from hangwatch.demo.wait import wait_until
from harness.ports import address_in_use, free_port
from harness.stack import Stack

CACHE = os.environ.get("HANGWATCH_CACHE", "/var/cache/hangwatch")
MODEL_NAME = "tiny-vicuna"
HEARTBEAT_INTERVAL = 2      # FASTCHAT_WORKER_HEART_BEAT_INTERVAL (default 45)
HEARTBEAT_EXPIRATION = 6    # FASTCHAT_CONTROLLER_HEART_BEAT_EXPIRATION (default 90)
WORKER_API_TIMEOUT = 20     # FASTCHAT_WORKER_API_TIMEOUT (default 100)


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


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Server(Process):
    """One FastChat process (killed with SIGKILL if the test process dies: the controller's
    non-daemon heartbeat thread outlives a SIGTERM'd uvicorn)."""

    def __init__(self, role: str, argv: list[str], log_path: str, env: dict, cwd: str, port: int | None = None):
        super().__init__(role, argv, log_path, env=env, cwd=cwd, port=port, death_signal=signal.SIGKILL)

    @property
    def role(self) -> str:
        return self.name

    @property
    def process(self):
        return self.popen

    def log(self) -> str:
        return self.log_text()

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(lambda: proc_state(self.pid) == "T", 5, f"{self.role} stopped", interval=0.02)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)


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

    def _argv(self, module: str, args: list[str]) -> list[str]:
        return [python(), "-m", module, *args]

    def _log(self, role: str) -> str:
        return os.path.join(self.workdir, f"{role}.out")

    def _start_on_port_0(self, role: str, module: str, args: list[str]) -> Server:
        server = Server(role, self._argv(module, ["--host", "127.0.0.1", "--port", "0", *args]), self._log(role),
                        self.env(), self.workdir).start()
        try:
            server.wait_port(120)
        except BaseException:
            server.stop()
            raise
        return server

    def start_controller(self) -> Server:
        self.controller = self._start_on_port_0("controller", "fastchat.serve.controller", [])
        wait_until(lambda: requests.get(self.controller.url + "/test_connection", timeout=2).ok, 60,
                   "controller answers /test_connection", ignore=(requests.RequestException,))
        return self.controller

    def start_worker(self, wait: bool = True, model_name: str = MODEL_NAME, register: bool = True) -> Server:
        """A model worker on a free port (``wait_worker_ready`` moves it to another port if that
        one was taken before the worker bound it)."""
        worker = self._launch_worker(f"worker{len(self.workers)}", model_name, register)
        self.workers.append(worker)
        if wait:
            worker = self.wait_worker_ready(worker, registered=register)
        return worker

    def _launch_worker(self, role: str, model_name: str, register: bool) -> Server:
        port = free_port()
        controller_from = self.controller.log_size()  # its registration is logged after this
        worker = Server(role, self._argv("fastchat.serve.model_worker", [
            "--host", "127.0.0.1", "--port", str(port), "--worker-address", f"http://127.0.0.1:{port}",
            "--controller-address", self.controller.url, "--model-path", model_path(),
            "--model-names", model_name, "--device", "cpu", "--stream-interval", "1",
            *([] if register else ["--no-register"])]), self._log(f"{role}-{port}"), self.env(), self.workdir, port)
        worker.launch, worker.controller_from = (model_name, register), controller_from
        return worker.start()

    def wait_worker_ready(self, worker: Server, timeout: float = 120, registered: bool = True) -> Server:
        """The worker, listening, answering and (if ``registered``) registered; a worker whose
        port was taken before it bound is replaced, in ``workers``, by one on another port."""
        for attempt in range(1, 6):
            try:
                # The model loads before the bind (seconds): a taken port shows up here.
                wait_until(lambda: worker.check_alive() and worker.port in listening_ports(worker.pid), timeout,
                           f"{worker.role} to listen on {worker.port}", interval=0.2)
                break
            except ProcessExited:
                if attempt == 5 or not address_in_use(worker.log()):
                    raise
            # It registered before it failed to bind: let the controller drop it, then retry.
            self.wait_forgotten(worker.url)
            replacement = self._launch_worker(worker.role, *worker.launch)
            self.workers[self.workers.index(worker)] = replacement
            worker = replacement

        def answers():
            worker.check_alive()
            return requests.post(worker.url + "/worker_get_status", timeout=2).ok
        wait_until(answers, timeout, f"{worker.role} answers /worker_get_status", interval=0.3,
                   ignore=(requests.RequestException,))
        if registered:
            # The controller's own word, since this worker's launch: its URL anywhere in the log
            # was also an earlier worker's on the same port, its removal, or a registration the
            # controller had begun ("Register a new worker") and not yet done.
            done = f"Register done: {worker.url}, "
            wait_until(lambda: done in self.controller.log_since(worker.controller_from), timeout,
                       f"{worker.role} registered at the controller")
        return worker

    def wait_forgotten(self, url: str) -> None:
        """After a worker at ``url`` died: make the controller drop it now, if it ever registered
        (heartbeat expiry would, silently, up to two expiry periods later; until then the
        controller still routes to it). ``/refresh_all_workers`` asks every registered worker's
        status and logs each one it drops; the live workers register again."""
        if url not in self.controller.log():
            return
        offset = self.controller.log_size()
        requests.post(self.controller.url + "/refresh_all_workers", timeout=60).raise_for_status()
        wait_until(lambda: f"Remove stale worker: {url}" in self.controller.log_since(offset), 10,
                   f"the controller to drop {url}")

    def start_api(self) -> Server:
        self.api = self._start_on_port_0("api", "fastchat.serve.openai_api_server",
                                         ["--controller-address", self.controller.url])
        wait_until(lambda: requests.post(self.api.url + "/v1/chat/completions", json={}, timeout=2).status_code == 400,
                   60, "API server answers", ignore=(requests.RequestException,))
        return self.api

    def wait_heartbeat(self, worker: Server, timeout: float = 60) -> None:
        """Wait until the controller accepts a heartbeat of ``worker`` it knows (re-registered if dropped)."""
        offset = self.controller.log_size()
        wait_until(lambda: f"Receive heart beat. {worker.url}" in self.controller.log_since(offset), timeout,
                   f"controller receives a known heartbeat from {worker.role}", interval=0.1)

    def queue_length(self, worker: Server) -> int:
        return requests.post(worker.url + "/worker_get_status", timeout=5).json()["queue_length"]

    def settle(self, timeout: float = 120) -> None:
        """Every live worker thawed, with an empty queue and registered at the controller."""
        live = [w for w in self.workers if w.alive()]
        for worker in live:
            worker.thaw()
        for worker in live:
            wait_until(lambda: self.queue_length(worker) == 0, timeout, f"{worker.role} idle", interval=0.2,
                       ignore=(requests.RequestException,))
        offset = self.controller.log_size()
        wait_until(lambda: all(f"Receive heart beat. {w.url}" in self.controller.log_since(offset) for w in live),
                   timeout, "the controller to receive a known heartbeat from every worker")

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
        started = [fleet.start_worker(wait=False) for _ in range(n_workers)]  # their models load side by side
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


# Seconds. A silent target holds its scrape for the whole budget (scrape_timeout minus the
# exporter's offset), and its sample counts only once the scrape ends: a budget of 1.5 s of a
# 4 s interval keeps "twice in a row" visible for most of each interval.
SCRAPE = 4.0
SCRAPE_TIMEOUT = 2.0


def fleet_stack(workdir: Path, fleet: Fleet, vllm_url: str, *, urls: dict[str, str] | None = None,
                **stack_args) -> Stack:
    """The one stack, configured from examples/fleet/prometheus.yml for this deployment plus a
    vLLM box at ``vllm_url`` (rules retimed, every duration scaled, to a ``SCRAPE`` interval).
    ``urls`` overrides a member's URL; the rest (containers, hook, extra targets) is
    :class:`harness.stack.Stack`'s."""
    targets = {"vllm-a": vllm_url, "fc-controller": fleet.controller.url, "fc-api": fleet.api.url,
               **{f"fc-worker-{i}": worker.url for i, worker in enumerate(fleet.workers[:2])}, **(urls or {})}
    return Stack(workdir, SCRAPE, scrape_timeout=SCRAPE_TIMEOUT, targets=targets, example="fleet/prometheus.yml",
                 **stack_args)
