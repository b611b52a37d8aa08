"""Discovery without side effects, the Prometheus way: examples/fleet's static, file_sd and
docker_sd configs, loaded by a real Prometheus, give every target the module that checks it,
its name, its fleet, and a container only where the webhook may restart one.

Discovery reads Prometheus' own config, files and the Docker engine's container list; it
never asks a FastChat controller (which cannot list worker addresses: docs/fleets.md).
"""
from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import yaml

from hangwatch.demo.processes import start_server
from hangwatch.demo.wait import wait_until
from tests.support.require import require_binary
from tests.webhook.real_parts import backend_image, docker_client, dockerd  # noqa: F401

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "examples" / "fleet"
EXPORTER = "127.0.0.1:9877"
# What every example must give each target: (module, fleet, container or None).
EXPECTED = {
    "vllm-a": ("backend", "gpu", "vllm-a"),
    "fc-worker-0": ("fastchat_worker", "fastchat", "fc-worker-0"),
    "fc-worker-1": ("fastchat_worker", "fastchat", "fc-worker-1"),
    "fc-controller": ("fastchat_controller", "fastchat", None),
    "fc-api": ("fastchat_api", "fastchat", None),
}


class Prom:
    def __init__(self, config: Path, workdir: Path):
        self.process = start_server("prometheus", [
            shutil.which("prometheus") or "prometheus", f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'prom-data'}", "--web.listen-address=127.0.0.1:0"],
            workdir / "prometheus.log", "/-/ready")
        self.port = self.process.port

    def targets(self) -> dict[str, tuple[str, str | None, str | None, str]]:
        """target name -> (module, fleet, container, instance) of the job "hangwatch"."""
        answer = requests.get(f"http://127.0.0.1:{self.port}/api/v1/targets", timeout=5).json()
        out = {}
        for target in answer["data"]["activeTargets"]:
            if target["labels"].get("job") != "hangwatch":
                continue
            labels, query = target["labels"], parse_qs(urlsplit(target["scrapeUrl"]).query)
            assert urlsplit(target["scrapeUrl"]).netloc == EXPORTER, target["scrapeUrl"]
            assert query["target"] == [labels["instance"]]
            out[labels["target"]] = (query["module"][0], labels.get("fleet"), labels.get("container"),
                                     labels["instance"])
        return out

    def wait_targets(self, names, timeout: float = 30.0):
        return wait_until(lambda: (lambda t: t if set(t) == set(names) else None)(self.targets()), timeout,
                          f"targets {sorted(names)}", interval=0.3)

    def stop(self):
        self.process.stop()


def copy_config(name: str, workdir: Path) -> Path:
    """An example config with its rule paths made absolute (the example is used as it is)."""
    config = yaml.safe_load((FLEET / name).read_text())
    config["rule_files"] = [str((FLEET / path).resolve()) for path in config["rule_files"]]
    path = workdir / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def check_expected(found: dict):
    for name, (module, fleet, container) in EXPECTED.items():
        assert found[name][:3] == (module, fleet, container), (name, found[name])


@pytest.fixture
def prom_binary():
    require_binary("prometheus")
    require_binary("promtool")


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-file-sd.yml", "prometheus-docker-sd.yml"])
def test_examples_are_valid_prometheus_configs(name, prom_binary):
    result = subprocess.run(["promtool", "check", "config", str(FLEET / name)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_example_is_valid():
    require_binary("docker-compose")
    result = subprocess.run(["docker-compose", "-f", str(FLEET / "docker-compose.fastchat.yml"), "config", "-q"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_static_targets_say_which_module_checks_them(prom_binary, tmp_path):
    prom = Prom(copy_config("prometheus.yml", tmp_path), tmp_path)
    try:
        check_expected(prom.wait_targets(EXPECTED))
    finally:
        prom.stop()


def test_file_sd_targets_come_and_go_without_a_reload(prom_binary, tmp_path):
    config = copy_config("prometheus-file-sd.yml", tmp_path)
    shutil.copytree(FLEET / "targets", tmp_path / "targets")
    prom = Prom(config, tmp_path)
    try:
        check_expected(prom.wait_targets(EXPECTED))
        groups = yaml.safe_load((tmp_path / "targets" / "fastchat.yml").read_text())
        groups.append({"targets": ["http://127.0.0.1:21004"],
                       "labels": {"target": "fc-worker-2", "container": "fc-worker-2", "fleet": "fastchat",
                                  "__param_module": "fastchat_worker"}})
        (tmp_path / "targets" / "fastchat.yml").write_text(yaml.safe_dump(groups))
        found = prom.wait_targets([*EXPECTED, "fc-worker-2"])
        assert found["fc-worker-2"] == ("fastchat_worker", "fastchat", "fc-worker-2", "http://127.0.0.1:21004")
    finally:
        prom.stop()


def test_docker_sd_finds_labelled_containers_and_only_opted_in_ones_may_be_restarted(
        prom_binary, docker_client, backend_image, tmp_path):  # noqa: F811
    suffix = uuid.uuid4().hex[:6]
    specs = {  # container name -> labels (as in docker-compose.fastchat.yml, on loopback)
        f"fc-controller-{suffix}": {"io.hangwatch.module": "fastchat_controller", "io.hangwatch.fleet": "fastchat",
                                    "io.hangwatch.url": "http://127.0.0.1:21001",
                                    "io.hangwatch.target": "fc-controller"},
        f"fc-worker-0-{suffix}": {"io.hangwatch.module": "fastchat_worker", "io.hangwatch.fleet": "fastchat",
                                  "io.hangwatch.url": "http://127.0.0.1:21002", "io.hangwatch.restart": "true"},
        f"fc-worker-1-{suffix}": {"io.hangwatch.module": "fastchat_worker", "io.hangwatch.fleet": "fastchat",
                                  "io.hangwatch.url": "http://127.0.0.1:21003", "io.hangwatch.restart": "no"},
        f"no-url-{suffix}": {"io.hangwatch.module": "fastchat_worker"},         # cannot be read: dropped
        f"unlabelled-{suffix}": {},                                             # not hangwatch's
    }
    containers = []
    prom = None
    try:
        for name, labels in specs.items():
            containers.append(docker_client.containers.run(
                backend_image, ["/usr/bin/sleep", "600"], name=name, labels=labels, detach=True, init=True,
                network_mode="host", volumes={"/usr": {"bind": "/usr", "mode": "ro"}}))
        prom = Prom(copy_config("prometheus-docker-sd.yml", tmp_path), tmp_path)
        found = prom.wait_targets(["fc-controller", f"fc-worker-0-{suffix}", f"fc-worker-1-{suffix}"], timeout=60)
        assert found["fc-controller"] == ("fastchat_controller", "fastchat", None, "http://127.0.0.1:21001")
        assert found[f"fc-worker-0-{suffix}"] == ("fastchat_worker", "fastchat", f"fc-worker-0-{suffix}",
                                                  "http://127.0.0.1:21002")
        assert found[f"fc-worker-1-{suffix}"] == ("fastchat_worker", "fastchat", None, "http://127.0.0.1:21003")
    finally:
        if prom is not None:
            prom.stop()
        for container in containers:
            try:
                container.remove(force=True)
            except Exception:
                pass
