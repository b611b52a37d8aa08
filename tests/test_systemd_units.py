"""deploy/systemd: the no-Docker path's units and configs, checked by systemd's own verifier and
against hangwatch's command line, config loaders and stop bound.

No systemd runs on these machines, so the services are not started here; ``systemd-analyze
verify`` parses each unit as systemd would (an unknown key or a bad value is a warning, which
fails here) with ExecStart pointed at this checkout's ``hangwatch``.
"""
from __future__ import annotations

import configparser
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hangwatch.cli import build_parser
from hangwatch.exporter.config import load_exporter_config
from hangwatch.settings import EXIT_CONFIG
from hangwatch.webhook.app import restart_bound
from hangwatch.webhook.config import load_config as load_webhook_config
from tests.support.require import require_binary
from tests.support.servers import REPO

UNITS = REPO / "deploy" / "systemd"
INSTALLED = "/opt/hangwatch/bin/hangwatch"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize("name", ["hangwatch-exporter.service", "hangwatch-webhook.service"])
def test_systemd_accepts_the_unit_without_a_warning(name, tmp_path):
    analyze = require_binary("systemd-analyze")
    hangwatch = Path(sys.executable).parent / "hangwatch"  # this venv's command (systemd checks it exists)
    assert hangwatch.exists(), hangwatch
    (tmp_path / name).write_text((UNITS / name).read_text().replace(INSTALLED, str(hangwatch)))
    done = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / name)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.parametrize("name, command", [("hangwatch-exporter.service", "exporter"),
                                           ("hangwatch-webhook.service", "webhook")])
def test_the_unit_runs_the_command_line_hangwatch_defines(name, command):
    service = unit(name)["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED and argv[1] == command
    args = build_parser().parse_args(argv[1:])
    assert args.listen.startswith("127.0.0.1:"), "loopback, as the defaults"
    assert service["RestartPreventExitStatus"] == str(EXIT_CONFIG), "a bad config is not restarted in a loop"
    assert service["Restart"] == "on-failure" and service["DynamicUser"] == "yes"


def test_the_units_configs_load_and_the_webhook_may_finish_a_restart():
    exporter = load_exporter_config(str(UNITS / "exporter.yml"))
    assert exporter.allow_targets == ("http://127.0.0.1:8000",)
    webhook = load_webhook_config(str(UNITS / "webhook.yml"))
    service = unit("hangwatch-webhook.service")["Service"]
    assert webhook.token_file == "/run/credentials/hangwatch-webhook.service/hangwatch-token"
    assert service["LoadCredential"] == "hangwatch-token:/etc/hangwatch/hangwatch-token"
    assert webhook.state_dir == f"/var/lib/{service['StateDirectory']}"
    stop = float(service["TimeoutStopSec"].rstrip("s"))
    assert stop > restart_bound(webhook), "systemd would SIGKILL a restart under way"
    assert (webhook.targets[0].name, webhook.targets[0].url) == ("vllm", exporter.allow_targets[0])


def test_the_forensics_drop_in_grants_ptrace_and_systemd_accepts_it(tmp_path):
    """deploy/systemd/hangwatch-exporter.service.d/forensics.conf: the exporter unit with it is still
    valid, and only then may it ptrace (the unit alone has no capability at all)."""
    analyze = require_binary("systemd-analyze")
    hangwatch = Path(sys.executable).parent / "hangwatch"
    drop_in = (UNITS / "hangwatch-exporter.service.d" / "forensics.conf").read_text()
    merged = (UNITS / "hangwatch-exporter.service").read_text().replace(INSTALLED, str(hangwatch)) + "\n" + drop_in
    (tmp_path / "hangwatch-exporter.service").write_text(merged)
    done = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / "hangwatch-exporter.service")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    assert unit("hangwatch-exporter.service")["Service"]["CapabilityBoundingSet"] == ""
    granted = configparser.ConfigParser(strict=False, interpolation=None)
    granted.optionxform = str
    granted.read_string(drop_in)
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        assert set(granted["Service"][key].split()) == {"CAP_SYS_PTRACE"}  # no CAP_DAC_READ_SEARCH (issue 35)
    text = " ".join(line.lstrip("# ") for line in drop_in.splitlines())
    assert "memory of ANY process" in text and "cgroup: /sys/fs/cgroup/system.slice/vllm.service" in text
