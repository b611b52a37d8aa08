"""Real Prometheus + Alertmanager + the hangwatch exporter watching a real FastChat deployment
and a vLLM box (the simulator), configured from examples/fleet/prometheus.yml.

Only addresses, paths and timings are replaced in the example (the scrape interval becomes
``SCRAPE`` seconds and the rules are rendered by ``hangwatch rules`` for it, every duration scaled), so
what is tested is what users deploy. Alertmanager routes as examples/alertmanager.yml says:
the restart route to ``hook_url`` (a recorder or the real webhook), the rest to people (a
recorder). Every process is stopped by PID in :meth:`close`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import requests
import yaml

from hangwatch.rules.render import format_duration, render_file, shrunk
from tests.e2e.stack import (TOKEN, Process, Receiver, _wait_http, free_port, start_alertmanager,
                             start_prometheus, wait_until)

REPO = Path(__file__).resolve().parents[2]
# Seconds. A silent target holds its scrape for the whole budget (scrape_timeout - 0.5 s), and
# its sample counts only once the scrape ends: a budget of 1.5 s of a 4 s interval keeps
# "twice in a row" visible for most of each interval.
SCRAPE = 4.0
SCRAPE_TIMEOUT = 2.0


class FleetStack:
    def __init__(self, workdir: Path, fleet, vllm_url: str, *, hook_url: str | None = None,
                 token_file: Path | None = None, worker_containers: dict | None = None,
                 url_overrides: dict | None = None, extra_targets: list | None = None):
        self.workdir, self.fleet, self.vllm_url = workdir, fleet, vllm_url
        self.hook_url, self.token_file = hook_url, token_file
        self.worker_containers = worker_containers or {}
        self.url_overrides = url_overrides or {}
        self.extra_targets = extra_targets or []   # static target groups added to the example's
        self.processes: list[Process] = []
        self.receiver = Receiver()

    # -- start -----------------------------------------------------------------------------
    def start(self) -> "FleetStack":
        try:
            self.exporter_port, self.prom_port, self.am_port = free_port(), free_port(), free_port()
            hangwatch = shutil.which("hangwatch") or "hangwatch"
            self.exporter = self._spawn("exporter", [hangwatch, "exporter", "--listen",
                                                     f"127.0.0.1:{self.exporter_port}"])
            _wait_http(self.exporter, f"http://127.0.0.1:{self.exporter_port}/metrics")
            self.alertmanager = start_alertmanager(self._spawn, self.workdir, self.alertmanager_config(),
                                                   self.am_port)
            self.prometheus = start_prometheus(self._spawn, self.workdir, self.prometheus_config(), self.prom_port)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.workdir / f"{name}.log")
        self.processes.append(process)
        return process

    # -- configs derived from the examples ----------------------------------------------------
    def rule_files(self) -> list[Path]:
        sources = [REPO / "rules" / "hangwatch-recording.yml", REPO / "rules" / "hangwatch-alerts.yml",
                   REPO / "rules" / "hangwatch-fleet.yml"]
        paths = []
        for source in sources:
            target = self.workdir / ("retimed-" + source.name)
            target.write_text(render_file(source.name, shrunk(SCRAPE)))
            paths.append(target)
        return paths

    def urls(self) -> dict[str, str]:
        """Example target name -> the real URL it stands for here."""
        urls = {"vllm-a": self.vllm_url, "fc-controller": self.fleet.controller.url, "fc-api": self.fleet.api.url}
        for i, worker in enumerate(self.fleet.workers[:2]):
            urls[f"fc-worker-{i}"] = worker.url
        return {**urls, **self.url_overrides}

    def prometheus_config(self) -> dict:
        config = yaml.safe_load((REPO / "examples" / "fleet" / "prometheus.yml").read_text())
        interval = format_duration(SCRAPE)
        config["global"].update({"scrape_interval": interval, "evaluation_interval": interval})
        config["rule_files"] = [str(p) for p in self.rule_files()]
        config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{self.am_port}"]}]
        urls = self.urls()
        for job in config["scrape_configs"]:
            job["scrape_interval"] = interval
            job["scrape_timeout"] = format_duration(SCRAPE_TIMEOUT)
            if job["job_name"] == "hangwatch":
                for group in job["static_configs"]:
                    name = group["labels"]["target"]
                    group["targets"] = [urls[name]]
                    if name in self.worker_containers:
                        group["labels"]["container"] = self.worker_containers[name]
                job["static_configs"] += self.extra_targets
                for relabel in job["relabel_configs"]:
                    if relabel.get("target_label") == "__address__":
                        relabel["replacement"] = f"127.0.0.1:{self.exporter_port}"
            else:
                job["static_configs"] = [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]
        return config

    def alertmanager_config(self) -> dict:
        config = yaml.safe_load((REPO / "examples" / "alertmanager.yml").read_text())
        token_file = self.token_file or self.workdir / "token"
        if self.token_file is None:
            token_file.write_text(TOKEN)
        config["route"].update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"})
        for route in config["route"]["routes"]:
            route.update({"group_interval": "1s", "repeat_interval": "1h"})
        for receiver in config["receivers"]:
            if receiver["name"] == "hangwatch-webhook":
                hook = receiver["webhook_configs"][0]
                hook["url"] = self.hook_url or f"{self.receiver.url}/alerts"
                hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
            else:
                receiver.pop("email_configs", None)
                receiver["webhook_configs"] = [{"url": f"{self.receiver.url}/people", "send_resolved": True}]
        return config

    # -- Prometheus queries -----------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        response = requests.get(f"http://127.0.0.1:{self.prom_port}/api/v1/query", params={"query": expr}, timeout=5)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def by_target(self, expr: str) -> dict[str, float]:
        return {s["metric"].get("target", ""): float(s["value"][1]) for s in self.query(expr)}

    def states(self) -> dict[str, str]:
        return {s["metric"]["target"]: s["metric"]["state"]
                for s in self.query("target:hangwatch_backend_state:current == 1")}

    def wait_states(self, expected: dict[str, str], timeout: float = 60.0) -> dict[str, str]:
        def reached():
            for process in self.processes:
                process.check_alive()
            states = self.states()
            return states if all(states.get(t) == s for t, s in expected.items()) else None
        try:
            return wait_until(reached, timeout, f"states {expected}", interval=0.2)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; now {self.states()}") from None

    def ever_state(self, target: str, state: str, seconds: float) -> bool:
        result = self.query(f'max_over_time(target:hangwatch_backend_state:current'
                            f'{{target="{target}",state="{state}"}}[{max(1, round(seconds))}s])')
        return bool(result) and float(result[0]["value"][1]) == 1

    # -- stop ------------------------------------------------------------------------------
    def close(self):
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        self.receiver.close()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in self.processes)
