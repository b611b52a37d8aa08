"""``--log-level`` and ``--log-format json`` on both servers (hangwatch/logs.py).

The exporter's line per probe appears at ``debug`` and only there; ``json`` is one parseable
object per line, a traceback included; a bad ``$HANGWATCH_LOG_LEVEL`` is a config error (64).
"""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest
import requests

from hangwatch import logs
from hangwatch.settings import EXIT_CONFIG, ConfigError
from hangwatch.simulator import Simulator
from tests.support.servers import REPO, ServerProcess, free_port, webhook_config


@pytest.fixture
def restore_logging():
    root, ours = logging.getLogger(), logging.getLogger("hangwatch")
    saved = root.level, ours.level, list(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in saved[2]]:
        root.removeHandler(handler)
    root.setLevel(saved[0])
    ours.setLevel(saved[1])


def test_json_lines_parse_and_carry_the_traceback(restore_logging):
    stream = io.StringIO()
    logs.setup("info", "json", stream)
    log = logging.getLogger("hangwatch.test")
    log.info("hello %s", "world")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "hello world" and first["level"] == "info" and first["logger"] == "hangwatch.test"
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2026-12-01T10:00:00.123Z")
    assert second["level"] == "error" and "ValueError: boom" in second["exc"]


def test_debug_is_for_hangwatch_only_and_setup_replaces_its_own_handler(restore_logging):
    stream = io.StringIO()
    logs.setup("debug", "text", io.StringIO())
    logs.setup("debug", "text", stream)  # replaces the first handler: no line twice
    logging.getLogger("hangwatch.exporter").debug("ours")
    logging.getLogger("urllib3.connectionpool").debug("a library's socket chatter")
    logging.getLogger("urllib3.connectionpool").info("a library's info")
    text = stream.getvalue()
    assert text.count("ours") == 1 and "chatter" not in text and "a library's info" in text


def test_the_level_comes_from_the_flag_then_the_environment():
    assert logs.resolve_level("error", {"HANGWATCH_LOG_LEVEL": "debug"}) == "error"
    assert logs.resolve_level(None, {"HANGWATCH_LOG_LEVEL": "DEBUG"}) == "debug"
    assert logs.resolve_level(None, {}) == "info"
    with pytest.raises(ConfigError, match="HANGWATCH_LOG_LEVEL"):
        logs.resolve_level(None, {"HANGWATCH_LOG_LEVEL": "verbose"})


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


def _probe_lines(exporter: ServerProcess) -> list[str]:
    return [line for line in exporter.lines if "probe target=" in line]


def test_the_exporter_logs_each_probe_at_debug_as_json(sim):
    with ServerProcess("exporter", "--log-level", "debug", "--log-format", "json") as exporter:
        assert requests.get(f"{exporter.url}/probe", params={"target": sim.url}, timeout=10).status_code == 200
        exporter.stop()
    entries = [json.loads(line) for line in exporter.lines]  # every line is JSON
    probes = [e for e in entries if e["msg"].startswith("probe target=")]
    assert len(probes) == 1, exporter.log()
    assert probes[0]["level"] == "debug" and probes[0]["logger"] == "hangwatch.exporter"
    assert f"target={sim.url} module=backend status=ok in_flight=0 idle_probe=answered" in probes[0]["msg"]


def test_the_exporter_at_the_default_level_logs_no_probe_and_warning_hides_info(sim):
    with ServerProcess("exporter") as exporter:
        requests.get(f"{exporter.url}/probe", params={"target": sim.url}, timeout=10)
        exporter.stop()
    with ServerProcess("exporter", "--log-level", "warning", port=free_port()) as quiet:
        requests.get(f"{quiet.url}/probe", params={"target": sim.url}, timeout=10)
        quiet.stop()
    assert "listening on" in exporter.log() and not _probe_lines(exporter)
    assert quiet.lines == [], quiet.log()


def test_the_webhook_logs_json(tmp_path):
    with ServerProcess("webhook", "--config", str(webhook_config(tmp_path)), "--log-format", "json") as webhook:
        webhook.stop()
    entries = [json.loads(line) for line in webhook.lines]
    assert any("webhook listening on" in e["msg"] for e in entries)
    assert entries[-1]["msg"] == "webhook stopped"


@pytest.mark.parametrize("command", ["exporter", "webhook"])
def test_a_bad_log_level_in_the_environment_is_a_config_error(command, tmp_path):
    args = ["--config", str(webhook_config(tmp_path))] if command == "webhook" else []
    env = dict(os.environ, HANGWATCH_LOG_LEVEL="loud")
    done = subprocess.run([sys.executable, "-m", "hangwatch", command, *args, "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=30, env=env, cwd=REPO)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"hangwatch {command}: HANGWATCH_LOG_LEVEL: 'loud' is not one of debug, info, warning, error"]
