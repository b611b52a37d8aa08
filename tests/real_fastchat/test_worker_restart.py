"""A wedged FastChat worker in a Docker container is restarted once, end to end on real parts.

The worker runs in a container on the real Docker engine (``--network host --init``; the
image is an empty root with the host's /usr, the FastChat venv and the model bind-mounted
read-only). Prometheus scrapes it through the exporter as examples/fleet/prometheus.yml says;
``kill -STOP`` of the worker process makes it hung; HangwatchBackendHung goes through the real
Alertmanager to the real ``hangwatch webhook``, which re-checks the worker with the
``fastchat_worker`` module and restarts its container. Then the worker loads again,
re-registers at its controller and is idle.

What the webhook decided is the witness: its ledger (``state_dir/ledger.jsonl``) and its own
/metrics hold exactly one restart, of the frozen worker, and no decision about any other
member — a restart alert for the controller or the other worker would have reached it (as a
decision about an unknown target), since the restart route is the only way alerts get there.
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
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.demo.chain import hangwatch_command
from hangwatch.demo.files import private_file
from hangwatch.demo.processes import listening_ports, start_server
from hangwatch.demo.wait import wait_for_seconds, wait_until
from harness.ports import address_in_use, closed_port, free_port
from tests.real_fastchat import fleet as fleet_mod
from tests.real_fastchat.fleet import SCRAPE, fleet_stack
from tests.support.require import require_binary
from tests.webhook.real_parts import backend_image, docker_client, dockerd  # noqa: F401 (fixtures)

pytestmark = pytest.mark.real

TOKEN = "fleet-e2e-token-0123456789-0123456789"  # the webhook needs 32 characters or more


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
                if not requests.post(self.url + "/worker_get_status", timeout=2).ok:
                    return False
            except requests.RequestException:
                return False
            return self.port in listening_ports(self.worker_pid())  # our worker answered, not a squatter
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
    """A container worker on a free port; made again on another when that port was taken
    before the worker bound it (after the controller dropped the dead one's registration)."""
    for attempt in range(1, 6):
        worker = ContainerWorker(docker_client, backend_image, fleet, str(tmp_path / f"container-worker-{attempt}"))
        try:
            worker.wait_ready()
            break
        except AssertionError:
            clash = address_in_use(worker.logs())
            worker.remove()
            if attempt == 5 or not clash:
                raise
            fleet.wait_forgotten(worker.url)
    try:
        yield worker
    finally:
        worker.remove()
        fleet.wait_forgotten(worker.url)  # the fleet as it was for the next test, whatever its order


def ledger(state_dir) -> list[dict]:
    path = state_dir / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def webhook_samples(url: str, name: str) -> dict[tuple, float]:
    """The webhook's own /metrics: labels → value of every sample called ``name``."""
    text = requests.get(url + "/metrics", timeout=5).text
    return {tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def test_wedged_worker_is_restarted_once_through_alertmanager_and_the_webhook(fleet, container_worker, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    token = private_file(tmp_path / "token", TOKEN + "\n")
    state_dir = tmp_path / "state"
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({
        "token_file": str(token), "state_dir": str(state_dir), "cooldown": "15m",
        "recheck": {"interval": "1s", "timeout": "1s"}, "budget": {"restarts": 3, "window": "1h"},
        "targets": [{"name": "fc-worker-0", "container": container_worker.name, "url": container_worker.url,
                     "module": "fastchat_worker", "stop_timeout": "2s"}]}))
    webhook = start_server("webhook", [*hangwatch_command(), "webhook", "--config", str(config),
                                       "--listen", "127.0.0.1:0"], tmp_path / "webhook.log", "/healthz")
    down = f"http://127.0.0.1:{closed_port()}"  # no vLLM box here: it is simply down
    stack = fleet_stack(tmp_path, fleet, down, urls={"fc-worker-0": container_worker.url},
                        containers={"fc-worker-0": container_worker.name},
                        hook_url=webhook.url + "/alerts", token_file=token)
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
        # The new process loads the model again, re-registers and is idle.
        container_worker.wait_ready()
        fleet.wait_heartbeat(type("W", (), {"url": container_worker.url, "role": "container worker"})())
        stack.wait_states({"fc-worker-0": "idle"}, timeout=60)
        wait_for_seconds(5 * SCRAPE, "five more scrapes", check=stack.check_alive)
        wait_until(lambda: requests.get(webhook.url + "/healthz", timeout=5).json()["jobs_in_progress"] == 0,
                   30, "the webhook to finish its jobs")

        assert container_worker.restarts() == 1
        # What the webhook decided: one restart, of the frozen worker; nothing about anyone else.
        decisions = [e for e in ledger(state_dir) if e.get("event") == "decision"]
        restarts = [e for e in decisions if e["action"] == "restart"]
        assert len(restarts) == 1, decisions
        assert (restarts[0]["target"], restarts[0]["container"], restarts[0]["reason"]) == (
            "fc-worker-0", container_worker.name, "hung")
        assert {e["target"] for e in decisions} == {"fc-worker-0"}, decisions
        assert [e for e in ledger(state_dir) if e.get("event") == "restart"] == [
            e for e in ledger(state_dir) if e.get("event") == "restart" and e["target"] == "fc-worker-0"]
        counted = webhook_samples(webhook.url, "hangwatch_webhook_decisions_total")
        assert sum(v for labels, v in counted.items() if ("action", "restart") in labels) == 1, counted
        assert counted.get((("action", "skip"), ("reason", "unknown_target")), 0) == 0, counted
        restarted = {labels: v for labels, v in webhook_samples(webhook.url, "hangwatch_webhook_restarts_total").items()
                     if v}
        assert restarted == {(("result", "ok"), ("target", "fc-worker-0")): 1}, restarted
        # The webhook's own re-check used the FastChat module: two silent /worker_get_status.
        with open(restarts[0]["incident"]) as f:
            recheck = json.load(f)["recheck"]
        assert (recheck["module"], recheck["verdict"], recheck["probe_sent"]) == ("fastchat_worker", "hung", False)
        assert "/worker_get_status" in restarts[0]["detail"]
        print(f"frozen -> restarted in {restarted_after:.1f}s")
    except BaseException:
        if stack.prometheus is not None:
            print("states:", stack.states(), "alerts:", stack.query("ALERTS"), "stalled:",
                  stack.query("hangwatch_connection_stalled"))
        print(stack.logs(), webhook.log_tail(60), container_worker.logs()[-2000:], sep="\n")
        raise
    finally:
        if frozen is not None and fleet_mod.proc_state(frozen) is not None:
            os.kill(frozen, signal.SIGCONT)
        stack.close()
        webhook.stop()
