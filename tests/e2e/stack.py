"""Real Prometheus + Alertmanager + the hangwatch exporter + the vLLM simulator, on loopback.

Used by the end-to-end tests and by ``bench/bench_alert_latency.py``. The Prometheus and
Alertmanager configs are derived from ``examples/prometheus.yml`` and
``examples/alertmanager.yml`` (only addresses, paths and timings are replaced), and the rules
are the ones ``hangwatch rules`` renders for the short scrape interval (wall-clock durations shrunk alike), so the
tests exercise what users deploy. A small in-process receiver records what Alertmanager
delivers: ``/alerts`` (the restart route, Bearer token checked) and ``/people``.

Every process is started here and stopped by its PID in ``close()``; nothing is left behind.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from hangwatch.rules.render import format_duration, render_file, shrunk

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = (REPO / "rules" / "hangwatch-recording.yml", REPO / "rules" / "hangwatch-alerts.yml")
TOKEN = "e2e-secret-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class Receiver:
    """Records every webhook delivery from Alertmanager."""

    def __init__(self):
        self.deliveries: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/alerts" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.deliveries.append({"path": self.path, "at": time.time(),
                                                "payload": json.loads(body)})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, path: str, alertname: str | None = None) -> list[tuple[float, dict]]:
        """(delivery time, alert) for every firing alert delivered to ``path``."""
        with self.lock:
            deliveries = list(self.deliveries)
        return [(d["at"], alert) for d in deliveries if d["path"] == path
                for alert in d["payload"]["alerts"]
                if alert["status"] == "firing" and alertname in (None, alert["labels"].get("alertname"))]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Process:
    def __init__(self, name: str, argv: list[str], log_path: Path):
        self.name, self.log_path = name, log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=REPO, start_new_session=True)

    def check_alive(self):
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self):
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)


def _wait_http(process: Process, url: str, timeout: float = 20.0):
    def ready():
        process.check_alive()
        try:
            return requests.get(url, timeout=1).status_code == 200
        except requests.RequestException:
            return False
    wait_until(ready, timeout, f"{process.name} at {url}")


def start_alertmanager(spawn, workdir: Path, config: dict, port: int) -> Process:
    """A real Alertmanager (no cluster port) on ``port``, ready."""
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    process = spawn("alertmanager", [
        shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
        f"--config.file={path}", f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="])
    _wait_http(process, f"http://127.0.0.1:{port}/-/ready")
    return process


def start_prometheus(spawn, workdir: Path, config: dict, port: int) -> Process:
    """A real Prometheus on ``port`` with ``config``, ready."""
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    process = spawn("prometheus", [
        shutil.which("prometheus") or "prometheus", f"--config.file={path}",
        f"--storage.tsdb.path={workdir / 'prom-data'}", f"--web.listen-address=127.0.0.1:{port}"])
    _wait_http(process, f"http://127.0.0.1:{port}/-/ready")
    return process


class Stack:
    """Simulator (in-process) → exporter → Prometheus → Alertmanager → Receiver."""

    TARGET = {"target": "vllm-a", "container": "vllm-a"}

    def __init__(self, workdir: Path, scrape_interval: float = 1.0, simulator=None,
                 scrape_timeout: float | None = None):
        self.workdir = workdir
        self.scrape_interval = scrape_interval
        self.scrape_timeout = scrape_timeout or scrape_interval
        self.processes: list[Process] = []
        self.receiver: Receiver | None = None
        self.sim = simulator
        self._own_sim = simulator is None  # a backend handed in (a real vLLM) is not ours to stop

    # -- start -----------------------------------------------------------------------------
    def start(self) -> "Stack":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self):
        if self.sim is None:
            from hangwatch.simulator import Simulator
            self.sim = Simulator()
            self.sim.start(port=0)
        self.receiver = Receiver()
        self.exporter_port, self.prom_port, self.am_port = free_port(), free_port(), free_port()
        # A 1 s scrape timeout minus the default 0.5 s offset would leave the idle probe
        # 0.25 s: too tight on a loaded 2-core machine (a slow probe twice is "hung").
        exporter_config = self.workdir / "exporter.yml"
        exporter_config.write_text("timeout_offset: 100ms\n")
        self.exporter = self._spawn("exporter", [self._hangwatch(), "exporter", "--listen",
                                                 f"127.0.0.1:{self.exporter_port}", "--config", str(exporter_config)])
        _wait_http(self.exporter, f"http://127.0.0.1:{self.exporter_port}/metrics")
        self.alertmanager = start_alertmanager(self._spawn, self.workdir, self.alertmanager_config(), self.am_port)
        self.prometheus = start_prometheus(self._spawn, self.workdir, self.prometheus_config(), self.prom_port)

    def _hangwatch(self) -> str:
        candidate = Path(sys.executable).with_name("hangwatch")
        return str(candidate) if candidate.exists() else (shutil.which("hangwatch") or "hangwatch")

    def _spawn(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.workdir / f"{name}.log")
        self.processes.append(process)
        return process

    # -- configs derived from the examples ----------------------------------------------------
    def rule_files(self) -> list[Path]:
        paths = []
        for path in RULE_FILES:
            target = self.workdir / path.name
            target.write_text(render_file(path.name, shrunk(self.scrape_interval)))
            paths.append(target)
        return paths

    def prometheus_config(self) -> dict:
        config = yaml.safe_load((REPO / "examples" / "prometheus.yml").read_text())
        interval = format_duration(self.scrape_interval)
        config["global"].update({"scrape_interval": interval, "evaluation_interval": interval})
        config["rule_files"] = [str(p) for p in self.rule_files()]
        config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{self.am_port}"]}]
        for job in config["scrape_configs"]:
            job["scrape_interval"] = interval
            job["scrape_timeout"] = format_duration(self.scrape_timeout)
            if job["job_name"] == "hangwatch":
                job["static_configs"] = [{"targets": [self.sim.url], "labels": dict(self.TARGET)}]
                for relabel in job["relabel_configs"]:
                    if relabel.get("target_label") == "__address__":
                        relabel["replacement"] = f"127.0.0.1:{self.exporter_port}"
            else:
                job["static_configs"] = [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]
        return config

    def alertmanager_config(self) -> dict:
        config = yaml.safe_load((REPO / "examples" / "alertmanager.yml").read_text())
        token_file = self.workdir / "token"
        token_file.write_text(TOKEN)
        config["route"].update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"})
        for route in config["route"]["routes"]:
            route.update({"group_interval": "1s", "repeat_interval": "1h"})
        for receiver in config["receivers"]:
            if receiver["name"] == "hangwatch-webhook":
                hook = receiver["webhook_configs"][0]
                hook["url"] = f"{self.receiver.url}/alerts"
                hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
            else:  # people: a webhook to the recorder instead of e-mail
                receiver.pop("email_configs", None)
                receiver["webhook_configs"] = [{"url": f"{self.receiver.url}/people", "send_resolved": True}]
        return config

    # -- Prometheus queries -----------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        response = requests.get(f"http://127.0.0.1:{self.prom_port}/api/v1/query", params={"query": expr}, timeout=5)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def state(self) -> str | None:
        """The backend's current state as the recording rules see it."""
        for series in self.query('target:hangwatch_backend_state:current{target="vllm-a"} == 1'):
            return series["metric"]["state"]
        return None

    def wait_state(self, state: str, timeout: float = 20.0):
        def reached():
            for process in self.processes:
                process.check_alive()
            return self.state() == state
        wait_until(reached, timeout, f"state {state} in Prometheus (now {self.state()})", interval=0.1)

    def ever(self, state: str, seconds: float) -> bool:
        """Was the state 1 at any rule evaluation in the last ``seconds``?"""
        value = self.value(f'max_over_time(target:hangwatch_backend_state:current'
                           f'{{target="vllm-a",state="{state}"}}[{max(1, round(seconds))}s])')
        return bool(value)

    def latest_sample_time(self, metric: str) -> float:
        result = self.query(f'timestamp({metric}{{target="vllm-a"}})')
        return float(result[0]["value"][1]) if result else 0.0

    # -- stop ------------------------------------------------------------------------------
    def close(self):
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.receiver is not None:
            self.receiver.close()
        if self.sim is not None and self._own_sim:
            self.sim.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in self.processes)
