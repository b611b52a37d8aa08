"""The one Prometheus + Alertmanager chain of the demo, the tests and the benchmarks.

    hangwatch exporter → Prometheus (an example config, the shipped rules retimed)
                       → Alertmanager (examples/alertmanager.yml's routes) → receivers

Configs are the shipped examples (installed as ``hangwatch.examples``) with only addresses, paths
and timings replaced: the scrape interval and timeout, and the rules ``hangwatch rules`` renders for
that interval, so what is shown and tested is what users deploy. The restart route goes to
``hook_url`` (the real webhook) or to the in-process :class:`~hangwatch.demo.receiver.Receiver`'s
``/alerts`` (Bearer token checked); everything else goes to the receiver's ``/people``.

Every server binds port 0 and its port is read back (``processes.listening_ports``); every process
is stopped by PID in :meth:`Chain.close`. With ``targets=None`` the chain watches one
backend called ``vllm-a`` (container ``vllm-a``): the given ``simulator`` (anything with a
``.url``, a real vLLM included) or an in-process simulator it starts and stops itself. The
tests' waits on what Prometheus recorded are ``harness.stack.Stack``, built on this.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import requests
import yaml

from hangwatch import examples
from hangwatch.rules.render import Settings, format_duration, render_file, shrunk

from .files import private_file
from .processes import Process, start_server
from .receiver import Receiver

EXAMPLES = Path(examples.__file__).parent
RULE_FILES = ("hangwatch-recording.yml", "hangwatch-alerts.yml", "hangwatch-fleet.yml")  # as `hangwatch rules` writes
TOKEN = "e2e-secret-token-0123456789-0123456789"  # as long as the webhook requires (32+)
HUNG = "HangwatchBackendHung"


def exporter_offset(scrape_timeout: float) -> float:
    """The exporter's margin for its own work inside Prometheus' scrape timeout: the shipped
    0.5 s, or a quarter of a shorter timeout. (A 0.1 s margin turned one slow Python moment on
    a loaded machine into a failed scrape, i.e. a missing reading.)"""
    return min(0.5, scrape_timeout / 4)


def hangwatch_command() -> list[str]:
    """``hangwatch`` of the Python running this (its venv's script, else ``-m``)."""
    script = Path(sys.executable).with_name("hangwatch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hangwatch"]


class Chain:
    """Exporter, Alertmanager and Prometheus on loopback, configured from the examples.

    ``targets``: target name → URL. A name the example config lists keeps the example's
    labels (module, fleet, container); any other name gets ``container=<name>``.
    ``containers`` overrides container labels (None removes one). ``extra_targets`` are static
    groups added as they are. ``extra_jobs``: job name → address of another /metrics to scrape.
    """

    def __init__(self, workdir: Path, scrape_interval: float = 1.0, simulator=None,
                 scrape_timeout: float | None = None, *, targets: dict[str, str] | None = None,
                 example: str = "prometheus.yml", containers: dict[str, str | None] | None = None,
                 extra_targets: list[dict] | None = None, extra_jobs: dict[str, str] | None = None,
                 hook_url: str | None = None, token: str = TOKEN, token_file: Path | None = None,
                 exporter_config: dict | None = None, retime_all: bool = True,
                 use_prometheus: bool = True, use_alertmanager: bool = True):
        self.workdir = Path(workdir)
        self.scrape_interval = scrape_interval
        self.scrape_timeout = scrape_timeout or scrape_interval
        self.sim = simulator
        self._own_sim = simulator is None and targets is None
        self.targets = targets
        self.example = EXAMPLES / example
        self.containers = containers or {}
        self.extra_targets = extra_targets or []
        self.extra_jobs = extra_jobs or {}
        self.hook_url, self.token, self.token_file = hook_url, token, token_file
        self.exporter_settings = {"timeout_offset": f"{exporter_offset(self.scrape_timeout):g}s",
                                  **(exporter_config or {})}
        self.retime_all = retime_all
        self.use_prometheus = use_prometheus
        self.use_alertmanager = use_alertmanager and use_prometheus
        self.processes: list[Process] = []
        self.receiver: Receiver | None = None
        self._closed = False
        self.exporter = self.alertmanager = self.prometheus = None

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> "Chain":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "Chain":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        if self.targets is None:
            if self.sim is None:
                from hangwatch.simulator import Simulator
                self.sim = Simulator()
                self.sim.start(port=0)
            self.targets = {"vllm-a": self.sim.url}
        self.default_target = next(iter(self.targets))
        self.receiver = Receiver(self.token)
        config = self.workdir / "exporter.yml"
        config.write_text(yaml.safe_dump(self.exporter_settings))
        self.exporter = self._server("exporter", [*hangwatch_command(), "exporter", "--listen", "127.0.0.1:0",
                                                  "--config", str(config)], "/metrics")
        if self.use_alertmanager:
            path = self.workdir / "alertmanager.yml"
            path.write_text(yaml.safe_dump(self.alertmanager_config(), sort_keys=False))
            self.alertmanager = self._server("alertmanager", [
                shutil.which("prometheus-alertmanager") or "prometheus-alertmanager", f"--config.file={path}",
                f"--storage.path={self.workdir / 'alertmanager-data'}", "--web.listen-address=127.0.0.1:0",
                "--cluster.listen-address=", "--log.level=info"], "/-/ready")
        if self.use_prometheus:
            path = self.workdir / "prometheus.yml"
            path.write_text(yaml.safe_dump(self.prometheus_config(), sort_keys=False))
            self.prometheus = self._server("prometheus", [
                shutil.which("prometheus") or "prometheus", f"--config.file={path}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}", "--web.listen-address=127.0.0.1:0",
                "--log.level=warn"], "/-/ready")

    def _server(self, name: str, argv: list[str], ready_path: str) -> Process:
        process = start_server(name, argv, self.workdir / f"{name}.log", ready_path, cwd=self.workdir)
        self.processes.append(process)
        return process

    # -- configs derived from the examples -----------------------------------------------------
    def rule_files(self) -> list[Path]:
        paths = []
        for name in RULE_FILES:
            target = self.workdir / ("retimed-" + name)
            # retime_all: wall-clock durations (minutes, engine grace) shrink with the scrape
            # interval too; otherwise only the scrape-bound windows follow it.
            settings = shrunk(self.scrape_interval) if self.retime_all else Settings(scrape_interval=self.scrape_interval)
            target.write_text(render_file(name, settings))
            paths.append(target)
        return paths

    def _groups(self, example_groups: list[dict]) -> list[dict]:
        groups, named = [], set()
        for group in example_groups:
            name = group.get("labels", {}).get("target")
            if name in self.targets:
                groups.append({**group, "targets": [self.targets[name]], "labels": dict(group["labels"])})
                named.add(name)
        for name, url in self.targets.items():
            if name not in named:
                groups.append({"targets": [url], "labels": {"target": name, "container": name}})
        for group in groups:
            name = group["labels"]["target"]
            if name in self.containers:
                if self.containers[name] is None:
                    group["labels"].pop("container", None)
                else:
                    group["labels"]["container"] = self.containers[name]
        return groups + list(self.extra_targets)

    def prometheus_config(self) -> dict:
        config = yaml.safe_load(self.example.read_text())
        interval = format_duration(self.scrape_interval)
        timeout = format_duration(self.scrape_timeout)
        config["global"].update({"scrape_interval": interval, "evaluation_interval": interval})
        config["rule_files"] = [str(p) for p in self.rule_files()]
        if self.alertmanager is not None:
            config["alerting"]["alertmanagers"][0]["static_configs"] = [
                {"targets": [f"127.0.0.1:{self.alertmanager.port}"]}]
        else:
            config.pop("alerting", None)
        exporter = f"127.0.0.1:{self.exporter.port}"
        jobs = config["scrape_configs"]
        for name, address in self.extra_jobs.items():
            # A job the example already has (hangwatch_webhook) keeps its settings and gets the address.
            job = next((j for j in jobs if j["job_name"] == name), None)
            if job is None:
                jobs.append({"job_name": name, "static_configs": [{"targets": [address]}]})
            else:
                job["static_configs"] = [{"targets": [address]}]
        for job in jobs:
            job["scrape_interval"], job["scrape_timeout"] = interval, timeout
            if job["job_name"] == "hangwatch":
                job["static_configs"] = self._groups(job["static_configs"])
                for relabel in job["relabel_configs"]:
                    if relabel.get("target_label") == "__address__":
                        relabel["replacement"] = exporter
            elif job["job_name"] not in self.extra_jobs:
                job["static_configs"] = [{"targets": [exporter]}]
        return config

    def alertmanager_config(self) -> dict:
        config = yaml.safe_load((EXAMPLES / "alertmanager.yml").read_text())
        config.pop("global", None)  # the example's mail relay: nothing here sends mail
        token_file = self.token_file
        if token_file is None:
            token_file = private_file(self.workdir / "token", self.token + "\n")
        # Deliver at once, regroup every second, never repeat within a test: a second
        # notification of one alert is a real event (it resolved and fired again).
        config["route"].update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"})
        for route in config["route"]["routes"]:
            route.update({"group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"})
        for receiver in config["receivers"]:
            if receiver["name"] == "hangwatch-webhook":
                hook = receiver["webhook_configs"][0]
                hook["url"] = self.hook_url or f"{self.receiver.url}/alerts"
                hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
            else:  # people: the recorder instead of e-mail
                for key in [k for k in receiver if k.endswith("_configs")]:
                    receiver.pop(key)
                receiver["webhook_configs"] = [{"url": f"{self.receiver.url}/people", "send_resolved": True}]
        return config

    # -- Prometheus ----------------------------------------------------------------------------
    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": at}
        body = requests.get(f"{self.prometheus.url}/api/v1/query", params=params, timeout=10).json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {expr}: {body.get('error')}")
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        body = requests.get(f"{self.prometheus.url}/api/v1/query_range", timeout=20,
                            params={"query": expr, "start": start, "end": end, "step": step}).json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {expr}: {body.get('error')}")
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        """Prometheus' pending and firing alerts."""
        return requests.get(f"{self.prometheus.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]

    def alertmanager_alerts(self) -> list[dict]:
        return requests.get(f"{self.alertmanager.url}/api/v2/alerts", timeout=5).json()

    def check_alive(self) -> bool:
        """True, or ``ProcessExited`` naming the part that died, with its log's tail."""
        for process in self.processes:
            process.check_alive()
        return True

    # -- stop ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every process by PID (idempotent); their logs stay readable."""
        for process in reversed(self.processes):
            process.stop()
        if self.receiver is not None and not self._closed:
            self.receiver.close()
        if self.sim is not None and self._own_sim and not self._closed:
            self.sim.stop()
        self._closed = True

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail(lines)}" for p in self.processes)

