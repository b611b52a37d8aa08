"""Start and stop the whole hangwatch chain as local processes on loopback, in a temp dir.

The simulator, the exporter, Prometheus (with the rules ``hangwatch rules``
renders for the demo's scrape interval), Alertmanager and the webhook in dry-run
(``demo.nodocker``: the real app, the simulator standing in for Docker). Their configs are
the shipped ``examples/`` with only addresses, paths and timings replaced (and a scrape job
for the webhook's own metrics). Prometheus and
Alertmanager are optional: ``Stack.prometheus`` / ``Stack.alertmanager`` are None when the
binary is missing (``demo.run`` then plays their part in plain Python).

Every process writes to its own log file; ``Part.new_lines()`` tails it. ``Stack.stop()``
stops each process it started by PID (SIGTERM, then SIGKILL) and removes the temp dir.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from hangwatch.rules.render import Settings, render_file

REPO = Path(__file__).resolve().parents[1]
RULES = (REPO / "rules" / "hangwatch-recording.yml", REPO / "rules" / "hangwatch-alerts.yml",
         REPO / "rules" / "hangwatch-fleet.yml")
EXAMPLES = REPO / "examples"
TARGET = "vllm-sim"          # the `target` label and the webhook's target name
CONTAINER = "vllm-sim"       # the `container` label: the stand-in container the webhook may restart


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; raise with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (requests.RequestException, OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Part:
    """One process of the stack."""
    name: str
    url: str
    ready_path: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen | None = None
    _offset: int = field(default=0, repr=False)

    def start(self, env: dict | None = None) -> "Part":
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=REPO, env=env, start_new_session=True)
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 20.0) -> "Part":
        def ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            return requests.get(self.url + self.ready_path, timeout=1).status_code == 200
        wait_until(ready, timeout, f"{self.name} at {self.url}{self.ready_path}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def new_lines(self) -> list[str]:
        """Log lines written since the last call."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode("utf-8", "replace").splitlines()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Stack:
    """The demo's processes. ``with Stack() as stack: ...`` or ``start()`` / ``stop()``."""

    def __init__(self, scrape_interval: float = 2.0, recheck_interval: float = 2.0,
                 use_prometheus: bool = True, use_alertmanager: bool = True, keep: bool = False):
        self.scrape_interval = scrape_interval
        self.recheck_interval = recheck_interval
        self.keep = keep
        self.prometheus_bin = shutil.which("prometheus") if use_prometheus else None
        self.alertmanager_bin = (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
                                 if use_alertmanager and self.prometheus_bin else None)
        self.dir = Path(tempfile.mkdtemp(prefix="hangwatch-demo-"))
        self.token = secrets.token_urlsafe(24)
        self.parts: list[Part] = []
        self.simulator = self.exporter = self.prometheus = self.alertmanager = self.webhook = None
        self.started_at = time.time()

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "Stack":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def _part(self, name: str, port: int, ready_path: str, argv: list[str]) -> Part:
        part = Part(name, f"http://127.0.0.1:{port}", ready_path, argv, self.dir / f"{name}.log")
        self.parts.append(part)
        return part

    def start(self) -> "Stack":
        py = sys.executable
        env = dict(os.environ, PYTHONUNBUFFERED="1", HANGWATCH_LOG_LEVEL="info")
        sim_port, exp_port, wh_port = free_port(), free_port(), free_port()
        self.simulator = self._part("simulator", sim_port, "/health", [
            py, "-m", "hangwatch.simulator", "--listen", f"127.0.0.1:{sim_port}"]).start(env)
        self.simulator.wait_ready()

        (self.dir / "exporter.yml").write_text(yaml.safe_dump({"allow_targets": [self.simulator.url]}))
        self.exporter = self._part("exporter", exp_port, "/metrics", [
            py, "-m", "hangwatch", "exporter", "--listen", f"127.0.0.1:{exp_port}",
            "--config", str(self.dir / "exporter.yml")]).start(env)

        token_file = self.dir / "hangwatch-token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        (self.dir / "webhook.yml").write_text(yaml.safe_dump(self.webhook_config(token_file)))
        self.webhook = self._part("webhook", wh_port, "/healthz", [
            py, "-m", "demo.nodocker", "--config", str(self.dir / "webhook.yml"), "--dry-run",
            "--listen", f"127.0.0.1:{wh_port}", "--container", f"{CONTAINER}={self.simulator.url}"]).start(env)
        self.exporter.wait_ready()
        self.webhook.wait_ready()

        if self.alertmanager_bin:
            am_port = free_port()
            (self.dir / "alertmanager.yml").write_text(yaml.safe_dump(self.alertmanager_config(token_file)))
            self.alertmanager = self._part("alertmanager", am_port, "/-/ready", [
                self.alertmanager_bin, f"--config.file={self.dir / 'alertmanager.yml'}",
                f"--storage.path={self.dir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
                "--log.level=info"]).start(env)
            self.alertmanager.wait_ready()
        if self.prometheus_bin:
            prom_port = free_port()
            rules_dir = self.dir / "rules"
            rules_dir.mkdir()
            settings = Settings(scrape_interval=self.scrape_interval)
            for path in RULES:
                (rules_dir / path.name).write_text(render_file(path.name, settings))
            (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.prometheus_config(rules_dir)))
            self.prometheus = self._part("prometheus", prom_port, "/-/ready", [
                self.prometheus_bin, f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]).start(env)
            self.prometheus.wait_ready()
        return self

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- configs: the shipped examples, with loopback ports and demo timings -----------------
    def webhook_config(self, token_file: Path) -> dict:
        config = yaml.safe_load((EXAMPLES / "webhook.yml").read_text())
        interval = f"{self.recheck_interval:g}s"
        config.update({"token_file": str(token_file), "state_dir": str(self.dir / "webhook-state"), "dry_run": True,
                       "recheck": {"interval": interval, "timeout": interval},
                       "targets": [{"name": TARGET, "container": CONTAINER, "url": self.simulator.url,
                                    "module": "backend", "stop_timeout": "10s"}]})
        return config

    def alertmanager_config(self, token_file: Path) -> dict:
        config = yaml.safe_load((EXAMPLES / "alertmanager.yml").read_text())
        config.pop("global", None)  # the example's mail relay: the demo sends no mail
        config["route"].update({"group_wait": "1s", "group_interval": "5s"})
        for route in config["route"].get("routes", []):
            route.update({"group_wait": "0s", "group_interval": "5s"})
        for receiver in config["receivers"]:
            if receiver["name"] == "hangwatch-webhook":
                hook = receiver["webhook_configs"][0]
                hook["url"] = self.webhook.url + "/alerts"
                hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
            else:  # people: nobody to mail in a demo (the demo prints what Alertmanager holds)
                for key in [k for k in receiver if k.endswith("_configs")]:
                    receiver.pop(key)
        return config

    def prometheus_config(self, rules_dir: Path) -> dict:
        config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
        interval = f"{self.scrape_interval:g}s"
        exporter_address = self.exporter.url.removeprefix("http://")
        webhook_address = self.webhook.url.removeprefix("http://")
        config["global"].update({"scrape_interval": interval, "evaluation_interval": interval})
        config["rule_files"] = [str(rules_dir / "*.yml")]
        if self.alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [
                {"targets": [self.alertmanager.url.removeprefix("http://")]}]}]}
        else:
            config.pop("alerting", None)
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        # The webhook's self-metrics (decisions, restarts: the dashboard's annotations).
        jobs.setdefault("hangwatch_webhook", {"job_name": "hangwatch_webhook"})
        for name, job in jobs.items():
            job["scrape_interval"] = job["scrape_timeout"] = interval
            if name == "hangwatch":
                job["static_configs"] = [{"targets": [self.simulator.url],
                                          "labels": {"target": TARGET, "container": CONTAINER}}]
                for relabel in job["relabel_configs"]:
                    if relabel.get("target_label") == "__address__":
                        relabel["replacement"] = exporter_address
            elif name == "hangwatch_webhook":
                job["static_configs"] = [{"targets": [webhook_address]}]
            else:
                job["static_configs"] = [{"targets": [exporter_address]}]
        config["scrape_configs"] = list(jobs.values())
        return config

    # -- reading the parts ------------------------------------------------------------------
    def sim_state(self) -> dict:
        return requests.get(self.simulator.url + "/_sim/state", timeout=5).json()

    def drive(self, state: str, **params) -> None:
        response = requests.post(self.simulator.url + "/_sim/state", json={"state": state, **params}, timeout=5)
        response.raise_for_status()

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = at
        response = requests.get(self.prometheus.url + "/api/v1/query", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {expr}: {body.get('error')}")
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        response = requests.get(self.prometheus.url + "/api/v1/query_range", timeout=20,
                                params={"query": expr, "start": start, "end": end, "step": step})
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {expr}: {body.get('error')}")
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        """Prometheus' pending and firing alerts."""
        return requests.get(self.prometheus.url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]

    def alertmanager_alerts(self) -> list[dict]:
        return requests.get(self.alertmanager.url + "/api/v2/alerts", timeout=5).json()

    def webhook_metric(self, name: str, **labels) -> float:
        """Sum of the webhook's samples called ``name`` whose labels include ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families
        text = requests.get(self.webhook.url + "/metrics", timeout=5).text
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
