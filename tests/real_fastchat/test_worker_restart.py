"""A wedged FastChat worker in a Docker container is restarted once, end to end on real parts.

The worker runs in a container on the real Docker engine (``--network host --init``; the
image is an empty root with the host's /usr, the FastChat venv and the model bind-mounted
read-only). Prometheus scrapes it through the exporter as examples/fleet/prometheus.yml says;
``kill -STOP`` of the worker process makes it hung; HangwatchBackendHung goes through the real
Alertmanager to the real ``hangwatch webhook``, which re-checks the worker with the
``fastchat_worker`` module and restarts its container. Exactly one restart, then the worker
loads again, re-registers at its controller and is idle; the cooldown keeps it at one.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest
import requests

from tests.e2e.stack import wait_until
from tests.real_fastchat import fleet as fleet_mod
from tests.real_fastchat.prom_stack import SCRAPE, FleetStack
from tests.support.require import require_binary
from tests.webhook.real_parts import (WebhookProcess, backend_image, docker_client, dockerd,  # noqa: F401
                                      free_port, ledger)

pytestmark = pytest.mark.real

TOKEN = "fleet-e2e-token-0123456789"


def base_prefix() -> str:
    return subprocess.run([fleet_mod.python(), "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()


class ContainerWorker:
    """One FastChat model worker in its own container, registered at the host's controller."""

    def __init__(self, client, image, fleet, workdir):
        self.client, self.fleet = client, fleet
        self.name = f"hw-fc-worker-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        venv, model = fleet_mod.venv_path(), fleet_mod.model_path()
        env = {k: v for k, v in fleet.env().items() if k.startswith(("FASTCHAT_", "HF_", "TRANSFORMERS_", "OMP_"))}
        env.update({"LOGDIR": workdir, "HOME": workdir, "TMPDIR": workdir, "HF_HOME": workdir + "/hf",
                    "PYTHONUNBUFFERED": "1"})
        self.created = int(time.time()) - 1
        self.container = client.containers.run(
            image, [fleet_mod.python(), "-m", "fastchat.serve.model_worker", "--host", "127.0.0.1",
                    "--port", str(self.port), "--worker-address", self.url,
                    "--controller-address", fleet.controller.url, "--model-path", model,
                    "--model-names", fleet_mod.MODEL_NAME, "--device", "cpu"],
            name=self.name, detach=True, init=True, network_mode="host", environment=env, working_dir=workdir,
            volumes={"/usr": {"bind": "/usr", "mode": "ro"}, base_prefix(): {"bind": base_prefix(), "mode": "ro"},
                     venv: {"bind": venv, "mode": "ro"}, model: {"bind": model, "mode": "ro"},
                     workdir: {"bind": workdir, "mode": "rw"}})

    def wait_ready(self, timeout: float = 180) -> None:
        def ready():
            self.container.reload()
            if self.container.status not in ("running", "restarting", "created"):
                raise AssertionError(f"{self.name} {self.container.status}: {self.logs()[-3000:]}")
            try:
                return requests.post(self.url + "/worker_get_status", timeout=2).ok
            except requests.RequestException:
                return False
        wait_until(ready, timeout, f"{self.name} answers /worker_get_status", interval=0.5)

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def worker_pid(self) -> int:
        """The FastChat process: the child of the container's init."""
        self.container.reload()
        init = self.container.attrs["State"]["Pid"]
        with open(f"/proc/{init}/task/{init}/children") as f:
            children = [int(pid) for pid in f.read().split()]
        assert len(children) == 1, children
        return children[0]

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
def container_worker(fleet, docker_client, backend_image, tmp_path):  # noqa: F811
    worker = ContainerWorker(docker_client, backend_image, fleet, str(tmp_path / "container-worker"))
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.remove()


def test_wedged_worker_is_restarted_once_through_alertmanager_and_the_webhook(fleet, container_worker, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    state_dir = tmp_path / "state"
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({
        "token_file": str(token), "state_dir": str(state_dir), "cooldown": "15m",
        "recheck": {"interval": "1s", "timeout": "1s"}, "budget": {"restarts": 3, "window": "1h"},
        "targets": [{"name": "fc-worker-0", "container": container_worker.name, "url": container_worker.url,
                     "module": "fastchat_worker", "stop_timeout": "2s"}]}))
    webhook = WebhookProcess(config, tmp_path / "webhook.log")
    sim_url = f"http://127.0.0.1:{free_port()}"  # no vLLM box here: it is simply down
    stack = FleetStack(tmp_path, fleet, sim_url, hook_url=webhook.url + "/alerts", token_file=token,
                       worker_containers={"fc-worker-0": container_worker.name},
                       url_overrides={"fc-worker-0": container_worker.url})
    frozen = None
    try:
        stack.start()
        stack.wait_states({"fc-worker-0": "idle", "fc-worker-1": "idle", "fc-controller": "idle"}, timeout=90)
        frozen = container_worker.worker_pid()
        os.kill(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_until(lambda: container_worker.restarts() >= 1, 90, "one restart of the worker's container",
                   interval=0.5)
        restarted_after = time.monotonic() - frozen_at
        # The new process loads the model again, re-registers and is idle; still one restart.
        container_worker.wait_ready()
        fleet.wait_heartbeat(type("W", (), {"url": container_worker.url, "role": "container worker"})())
        stack.wait_states({"fc-worker-0": "idle"}, timeout=60)
        settle_until = time.monotonic() + 5 * SCRAPE
        wait_until(lambda: time.monotonic() > settle_until, 30, "five more scrapes")
        assert container_worker.restarts() == 1
        decisions = [e for e in ledger(state_dir) if e.get("event") == "decision"]
        restarts = [e for e in decisions if e["action"] == "restart"]
        assert len(restarts) == 1, decisions
        assert restarts[0]["target"] == "fc-worker-0" and restarts[0]["container"] == container_worker.name
        # The webhook's own re-check used the FastChat module: two silent /worker_get_status.
        with open(restarts[0]["incident"]) as f:
            recheck = json.load(f)["recheck"]
        assert (recheck["module"], recheck["verdict"], recheck["probe_sent"]) == ("fastchat_worker", "hung", False)
        assert "/worker_get_status" in restarts[0]["detail"]
        # The controller and the other worker were never touched: no restart alert for them.
        alerted = {a["labels"]["target"] for _, a in stack.receiver.alerts("/people")
                   if a["labels"]["alertname"] == "HangwatchBackendHung"}
        assert not alerted
        print(f"frozen -> restarted in {restarted_after:.1f}s")
    except BaseException:
        if stack.processes:
            print("states:", stack.states(), "alerts:", stack.query("ALERTS"), "stalled:",
                  stack.query("hangwatch_connection_stalled"))
        print(stack.logs(), webhook.log()[-3000:], container_worker.logs()[-2000:], sep="\n")
        raise
    finally:
        if frozen is not None and fleet_mod.proc_state(frozen) is not None:
            os.kill(frozen, signal.SIGCONT)
        stack.close()
        webhook.stop()
