"""Start and stop the whole hangwatch chain as local processes on loopback, in a temp dir.

The demo must show the chain users deploy, so it uses the one chain the tests and benchmarks use
(``chain``: the exporter, Prometheus with the shipped rules, Alertmanager, from the shipped
examples) and adds only its own parts: the simulator and the webhook in dry-run (``nodocker``).
Prometheus and Alertmanager are optional (None when missing: ``run`` then plays their part in plain
Python); ``Stack.stop()`` stops every process by PID and removes the temp dir. Every process runs in
that temp dir: none sees the directory the demo was started from.
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import requests
import yaml

from .chain import EXAMPLES, Chain
from .files import private_file
from .processes import Process, start_server

TARGET = "vllm-sim"          # the `target` label and the webhook's target name
CONTAINER = "vllm-sim"       # the `container` label: the stand-in container the webhook may restart


class Stack:
    """The demo's processes. ``with Stack() as stack: ...`` or ``start()`` / ``stop()``."""

    def __init__(self, scrape_interval: float = 2.0, recheck_interval: float = 2.0,
                 use_prometheus: bool = True, use_alertmanager: bool = True, keep: bool = False):
        self.scrape_interval = scrape_interval
        self.recheck_interval = recheck_interval
        self.keep = keep
        self.use_prometheus = bool(use_prometheus and shutil.which("prometheus"))
        self.use_alertmanager = bool(use_alertmanager and self.use_prometheus
                                     and shutil.which("prometheus-alertmanager"))
        self.dir = Path(tempfile.mkdtemp(prefix="hangwatch-demo-"))
        self.token = secrets.token_urlsafe(24)
        self.parts: list[Process] = []
        self.simulator = self.exporter = self.prometheus = self.alertmanager = self.webhook = None
        self.chain: Chain | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Stack":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        py = sys.executable
        env = dict(os.environ, PYTHONUNBUFFERED="1", HANGWATCH_LOG_LEVEL="info")
        self.simulator = self._part(start_server(
            "simulator", [py, "-m", "hangwatch.simulator", "--listen", "127.0.0.1:0"],
            self.dir / "simulator.log", "/health", env=env, cwd=self.dir))
        token_file = private_file(self.dir / "hangwatch-token", self.token + "\n")
        (self.dir / "webhook.yml").write_text(yaml.safe_dump(self.webhook_config(token_file)))
        self.webhook = self._part(start_server(
            "webhook", [py, "-m", "hangwatch.demo.nodocker", "--config", str(self.dir / "webhook.yml"),
                        "--dry-run", "--listen", "127.0.0.1:0", "--container", f"{CONTAINER}={self.simulator.url}"],
            self.dir / "webhook.log", "/healthz", env=env, cwd=self.dir))
        self.chain = Chain(self.dir, self.scrape_interval, targets={TARGET: self.simulator.url},
                           hook_url=self.webhook.url + "/alerts", token=self.token, token_file=token_file,
                           extra_jobs={"hangwatch_webhook": self.webhook.url.removeprefix("http://")},
                           exporter_config={"allow_targets": [self.simulator.url]},
                           retime_all=False,  # minutes stay minutes: only the scrape-bound windows shrink
                           use_prometheus=self.use_prometheus, use_alertmanager=self.use_alertmanager)
        try:
            self.chain.start()
        finally:
            self.parts.extend(self.chain.processes)
        self.exporter, self.prometheus, self.alertmanager = (self.chain.exporter, self.chain.prometheus,
                                                             self.chain.alertmanager)

    def _part(self, process: Process) -> Process:
        self.parts.append(process)
        return process

    def stop(self) -> None:
        if self.chain is not None:
            self.chain.close()
        for part in reversed(self.parts):
            part.stop()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def webhook_config(self, token_file: Path) -> dict:
        config = yaml.safe_load((EXAMPLES / "webhook.yml").read_text())
        interval = f"{self.recheck_interval:g}s"
        config.update({"token_file": str(token_file), "state_dir": str(self.dir / "webhook-state"), "dry_run": True,
                       "recheck": {"interval": interval, "timeout": interval},
                       "targets": [{"name": TARGET, "container": CONTAINER, "url": self.simulator.url,
                                    "module": "backend", "stop_timeout": "10s"}]})
        return config

    # -- reading the parts ------------------------------------------------------------------
    def sim_state(self) -> dict:
        return requests.get(self.simulator.url + "/_sim/state", timeout=5).json()

    def drive(self, state: str, **params) -> None:
        response = requests.post(self.simulator.url + "/_sim/state", json={"state": state, **params}, timeout=5)
        response.raise_for_status()

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        return self.chain.query(expr, at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.chain.query_range(expr, start, end, step)

    def alerts(self) -> list[dict]:
        """Prometheus' pending and firing alerts."""
        return self.chain.alerts()

    def alertmanager_alerts(self) -> list[dict]:
        return self.chain.alertmanager_alerts()

    def webhook_metric(self, name: str, **labels) -> float:
        """Sum of the webhook's samples called ``name`` whose labels include ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families
        text = requests.get(self.webhook.url + "/metrics", timeout=5).text
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
