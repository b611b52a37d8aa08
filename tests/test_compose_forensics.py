"""docker-compose.forensics.yml: stacks before a restart in compose (issue 25). The exporter joins
vLLM's PID namespace with SYS_PTRACE and forensics on, the webhook asks it before a restart; the
stack without the override grants none of it. Validated by docker-compose itself (``config -q``)
and hangwatch's own config loaders, like the stack (tests/test_compose.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from hangwatch.exporter.config import load_exporter_config
from hangwatch.webhook.app import restart_bound
from hangwatch.webhook.config import load_config as load_webhook_config
from tests.support.require import require_binary

from .test_compose import resolved

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
GPU = ["--profile", "gpu"]
FORENSICS = ["-f", str(REPO / "docker-compose.yml"), "-f", str(REPO / "docker-compose.forensics.yml")]


def test_docker_compose_accepts_the_override():
    docker_compose = require_binary("docker-compose")
    done = subprocess.run([docker_compose, *FORENSICS, *GPU, "config", "-q"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_the_exporter_shares_vllms_pid_namespace_with_sys_ptrace_alone():
    exporter = resolved(GPU, FORENSICS)["services"]["exporter"]
    assert exporter["pid"] == "service:vllm"
    assert exporter["cap_add"] == ["SYS_PTRACE"] and exporter["cap_drop"] == ["ALL"]
    assert exporter["mem_limit"] in (256 * 1024 * 1024, "256m", "268435456") and exporter["pids_limit"] == 64
    assert exporter["user"] == "0:0"  # Docker gives added capabilities to root only
    assert exporter["read_only"] is True and "no-new-privileges:true" in exporter["security_opt"]
    assert "ports" not in exporter
    mounts = [str(v).split(":")[0] for v in exporter["volumes"]]
    assert mounts == [str(DEPLOY / "forensics" / "exporter.yml")], mounts


def test_without_the_override_nothing_is_granted():
    exporter = resolved(GPU)["services"]["exporter"]
    assert "pid" not in exporter and "cap_add" not in exporter and exporter.get("user") != "0:0"
    assert not load_exporter_config(str(DEPLOY / "exporter.yml")).forensics.enabled
    assert all(t.forensics_url is None for t in load_webhook_config(str(DEPLOY / "webhook.yml")).targets)


def test_the_webhook_asks_the_exporter_that_can_see_vllm():
    services = resolved(GPU, FORENSICS)["services"]
    mounts = [str(v).split(":")[0] for v in services["webhook"]["volumes"]]
    assert str(DEPLOY / "forensics" / "webhook.yml") in mounts
    webhook = load_webhook_config(str(DEPLOY / "forensics" / "webhook.yml"))
    exporter = load_exporter_config(str(DEPLOY / "forensics" / "exporter.yml"))
    assert exporter.forensics.enabled
    listen = services["exporter"]["command"][services["exporter"]["command"].index("--listen") + 1]
    (target,) = webhook.targets
    assert target.forensics_url == f"http://exporter:{listen.rsplit(':', 1)[1]}"
    assert list(exporter.allow_targets) == [target.url]


def test_the_forensics_configs_are_the_stacks_plus_forensics_only():
    """They replace the stack's files: any other difference would be drift."""
    def data(path: Path) -> dict:
        return yaml.safe_load(path.read_text())
    exporter = data(DEPLOY / "forensics" / "exporter.yml")
    assert exporter.pop("forensics")["enabled"] is True
    assert exporter == data(DEPLOY / "exporter.yml")
    webhook = data(DEPLOY / "forensics" / "webhook.yml")
    for target in webhook["targets"]:
        target.pop("forensics_url")
    assert webhook == data(DEPLOY / "webhook.yml")


def test_sigterm_waits_for_a_restart_under_way_with_its_capture():
    webhook = resolved(GPU, FORENSICS)["services"]["webhook"]
    config = load_webhook_config(str(DEPLOY / "forensics" / "webhook.yml"))
    grace = webhook["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > restart_bound(config)


def test_the_restart_bound_counts_the_capture_only_where_one_is_asked():
    """SIGTERM's wait for a restart under way includes the capture before it, and only where a
    target asks for one (the two configs differ in ``forensics_url`` alone, as tested above)."""
    with_capture = load_webhook_config(str(DEPLOY / "forensics" / "webhook.yml"))
    without = load_webhook_config(str(DEPLOY / "webhook.yml"))
    assert restart_bound(with_capture) == restart_bound(without) + with_capture.forensics_timeout
