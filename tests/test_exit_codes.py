"""A bad flag or a bad config exits 64 with one line on stderr, in every subcommand.

The same code everywhere (DESIGN.md, ``hangwatch.settings.EXIT_CONFIG``), so a unit file or a
script can tell "fix the config" from a failure a restart might cure (systemd:
``RestartPreventExitStatus=64``). Before, ``hangwatch simulate`` exited 2 on a bad flag and 1
with a traceback on a missing file, and ``rules``/``dashboard`` with a traceback on an
unwritable ``--out``.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from hangwatch.settings import EXIT_CONFIG
from tests.support.servers import REPO

CASES = {
    "check: no URL": ["check"],
    "check: unknown flag": ["check", "http://127.0.0.1:9", "--bogus"],
    "check: missing key file": ["check", "http://127.0.0.1:9", "--api-key-file", "/nonexistent/key"],
    "check: the OpenAI base URL": ["check", "http://127.0.0.1:9/v1"],
    "check: a duration without a number": ["check", "http://127.0.0.1:9", "--interval", "fast"],
    "exporter: a Latin-1 config": ["exporter", "--config", "{tmp}/latin1.yml"],
    "webhook: a Latin-1 config": ["webhook", "--config", "{tmp}/latin1.yml"],
    "demo: unknown flag": ["demo", "--bogus"],
    "exporter: missing config": ["exporter", "--config", "/nonexistent/exporter.yml"],
    "exporter: bad listen": ["exporter", "--listen", "nonsense"],
    "exporter: bad log level": ["exporter", "--log-level", "loud"],
    "exporter: unknown config key": ["exporter", "--config", "{tmp}/unknown.yml"],
    "exporter: broken config file": ["exporter", "--config", "{tmp}/bad.yml"],
    "webhook: no config": ["webhook"],
    "webhook: missing config": ["webhook", "--config", "/nonexistent/webhook.yml"],
    "webhook: unknown config key": ["webhook", "--config", "{tmp}/unknown.yml"],
    "webhook: broken config file": ["webhook", "--config", "{tmp}/bad.yml"],
    "webhook: bad log format": ["webhook", "--config", "{tmp}/bad.yml", "--log-format", "xml"],
    "simulate: unknown flag": ["simulate", "--bogus"],
    "simulate: listen beyond loopback": ["simulate", "--listen", "10.0.0.1:8000"],
    "simulate: missing scenario": ["simulate", "--scenario", "/nonexistent/scenario.yaml"],
    "simulate: unknown state": ["simulate", "--scenario", "{tmp}/scenario.yaml"],
    "simulate: broken scenario file": ["simulate", "--scenario", "{tmp}/bad.yml"],
    "simulate: missing key file": ["simulate", "--api-key-file", "/nonexistent/key"],
    "rules: no --out": ["rules"],
    "rules: bad interval": ["rules", "--out", "{tmp}/out", "--scrape-interval", "0s"],
    "rules: unwritable --out": ["rules", "--out", "/proc/hangwatch-rules"],
    "dashboard: unwritable --out": ["dashboard", "--out", "/proc/hangwatch-dashboard"],
    "unknown subcommand": ["watch"],
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_bad_usage_or_config_exits_64_with_one_line(args, tmp_path):
    (tmp_path / "bad.yml").write_text("{no_such_key: 1\n")      # not YAML
    (tmp_path / "latin1.yml").write_bytes("timeout: 10s\n# caf\u00e9\n".encode("latin-1"))  # not UTF-8
    (tmp_path / "unknown.yml").write_text("no_such_key: 1\n")
    (tmp_path / "scenario.yaml").write_text("- {state: frozn}\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert done.returncode == EXIT_CONFIG, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch"), done.stderr
    assert "Traceback" not in done.stderr
