"""The full hangwatch chain for the soak, as users deploy it, on loopback.

    vLLM ← recording proxy ← hangwatch exporter ← Prometheus (shipped rules) → Alertmanager
                           ← hangwatch webhook (dry run) ← ────────────────────┘
                                     └→ a real Docker engine (the container's state)

How it measures: bench/README.md.
"""
from __future__ import annotations

import copy
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import requests
import yaml

from hangwatch.demo.files import private_file

REPO = Path(__file__).resolve().parents[1]
TARGET = "vllm-a"   # the target name the helper's state queries use


STALL_WINDOW_S = 12.0


def start_stack(workdir: Path, backend_url: str, *, container: str, hook_url: str, hook_token_file: Path,
                scrape_interval: float, scrape_timeout: float):
    """Exporter → Prometheus → Alertmanager watching ``backend_url`` as target ``vllm-a``
    (container label ``container``), the restart route delivering to ``hook_url`` (Bearer
    token from ``hook_token_file``) and to the helper's recording receiver. Started."""
    from harness.stack import Stack

    class SoakStack(Stack):
        def prometheus_config(self) -> dict:
            config = super().prometheus_config()
            for job in config["scrape_configs"]:
                if job["job_name"] == "hangwatch":
                    for group in job["static_configs"]:
                        group["labels"]["container"] = container
            return config

        def alertmanager_config(self) -> dict:
            config = super().alertmanager_config()
            for receiver in config["receivers"]:
                if receiver["name"] == "hangwatch-webhook":
                    hook = copy.deepcopy(receiver["webhook_configs"][0])
                    hook["url"] = hook_url
                    hook["http_config"]["authorization"]["credentials_file"] = str(hook_token_file)
                    receiver["webhook_configs"].append(hook)
            return config

    backend = type("Backend", (), {"url": backend_url})()
    # The stall window the fault tests prove stalls with (tests/real_faults): a saturated server,
    # long prefills included, must never go that long without output.
    return SoakStack(workdir, scrape_interval=scrape_interval, scrape_timeout=scrape_timeout,
                     simulator=backend,
                     exporter_config={"targets": [{"url": backend_url, "stall_window": f"{STALL_WINDOW_S:g}s"}]}).start()


def stack_processes(stack) -> dict[str, int]:
    """The PID of each process the helper started, by name (exporter, prometheus, alertmanager)."""
    return {process.name: process.popen.pid for process in stack.processes}


def stack_alive(stack) -> None:
    """Raise if a process of the helper's exited."""
    for process in stack.processes:
        process.check_alive()


def stack_notifications(stack) -> list[tuple[float, dict]]:
    """(wall time, alert) of every HangwatchBackendHung notification Alertmanager delivered
    on the restart route (the helper's recording receiver, beside the real webhook)."""
    return stack.receiver.alerts("/alerts", "HangwatchBackendHung")


# --------------------------------------------------------------------------------------------
# Docker


def docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_docker() -> None:
    """A Docker engine answering: ``.ci/start-dockerd.sh`` if none does (never stopped here)."""
    if docker_answers():
        return
    started = subprocess.run(["bash", str(REPO / ".ci" / "start-dockerd.sh")], capture_output=True, text=True,
                             timeout=120)
    if started.returncode != 0 or not docker_answers():
        raise RuntimeError(f"no Docker engine: {started.stdout}{started.stderr}")


class Sleeper:
    """A container that only sleeps, named for the soak; removed (with its image) by close()."""

    def __init__(self):
        tag = uuid.uuid4().hex[:8]
        self.name = f"hangwatch-soak-{tag}"
        self.image = f"hangwatch-soak-sleeper:{tag}"
        self._made_image = False

    def start(self) -> "Sleeper":
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name in ("usr", "tmp", "proc", "sys", "dev", "etc"):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            for name in ("lib", "lib64", "bin"):
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, f"usr/{name}"
                tar.addfile(info)
        _docker("import", "-", self.image, input=buffer.getvalue())
        self._made_image = True
        _docker("run", "-d", "--name", self.name, "--init", "--network", "none", "-v", "/usr:/usr:ro",
                self.image, "/usr/bin/sleep", "infinity")
        state = json.loads(_docker("inspect", "--format", "{{json .State}}", self.name))
        if not state.get("Running"):
            raise RuntimeError(f"the sleeper container is not running: {state}")
        return self

    def started_at(self) -> str:
        return _docker("inspect", "--format", "{{.State.StartedAt}}", self.name).strip()

    def close(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, timeout=60)
        if self._made_image:
            subprocess.run(["docker", "rmi", "-f", self.image], capture_output=True, timeout=60)


def _docker(*args: str, input: bytes | None = None) -> str:
    done = subprocess.run(["docker", *args], input=input, capture_output=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"docker {args[0]} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode(errors="replace")


# --------------------------------------------------------------------------------------------
# The webhook


class Webhook:
    """``hangwatch webhook --dry-run`` for one target; listens on a port it chose itself."""

    def __init__(self, workdir: Path, *, target_url: str, container: str, recheck_interval: float,
                 recheck_timeout: float):
        self.workdir = workdir
        self.token_file = private_file(workdir / "webhook-token", secrets.token_urlsafe(24) + "\n")
        self.state_dir = workdir / "webhook-state"
        config = yaml.safe_load((REPO / "examples" / "webhook.yml").read_text())
        config.update({
            "token_file": str(self.token_file), "state_dir": str(self.state_dir), "dry_run": True,
            "recheck": {"interval": f"{recheck_interval:g}s", "timeout": f"{recheck_timeout:g}s"},
            "targets": [{**config["targets"][0], "name": TARGET, "container": container, "url": target_url}],
        })
        self.config_path = workdir / "webhook.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "webhook.log"
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self, deadline_s: float = 30) -> "Webhook":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hangwatch", "webhook", "--config", str(self.config_path),
                 "--listen", "127.0.0.1:0", "--dry-run"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1", HANGWATCH_LOG_LEVEL="info"))
        deadline = time.monotonic() + deadline_s
        while not self.url:
            if self.process.poll() is not None:
                raise RuntimeError(f"the webhook exited with {self.process.returncode}:\n{self.log_tail()}")
            found = re.search(r"webhook listening on (http://127\.0\.0\.1:\d+)", self.log_path.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
            elif time.monotonic() > deadline:
                raise TimeoutError(f"the webhook did not start within {deadline_s:g} s:\n{self.log_tail()}")
            else:
                time.sleep(0.1)
        while True:
            try:
                if requests.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the webhook's /healthz did not answer within {deadline_s:g} s")
            time.sleep(0.1)

    def decisions(self) -> list[dict]:
        """Every decision in the ledger (``at`` is wall-clock time)."""
        path = self.state_dir / "ledger.jsonl"
        if not path.exists():
            return []
        return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
                if r.get("event") == "decision"]

    def decision_counts(self) -> dict[tuple[str, str], float]:
        """``hangwatch_webhook_decisions_total`` by (action, reason), from its /metrics."""
        from prometheus_client.parser import text_string_to_metric_families
        text = requests.get(self.url + "/metrics", timeout=5).text
        return {(s.labels["action"], s.labels["reason"]): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if s.name == "hangwatch_webhook_decisions_total" and s.value}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
