"""The exporter's ``GET /forensics?target=URL``: off by default, 409 unless hung, the capture when hung."""
from __future__ import annotations

import os

import pytest
import requests

from hangwatch.exporter.config import ConfigError, exporter_config
from hangwatch.simulator import Simulator
from tests.test_forensics_cli import marking_py_spy

FAST = {"liveness_interval": "0.3s", "liveness_timeout": "0.5s", "liveness_budget": "3s"}


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


@pytest.fixture
def exporter_with(exporters):
    return lambda data: exporters(exporter_config(data))[1]


def ask(exporter, target):
    return requests.get(exporter + "/forensics", params={"target": target}, timeout=60)


def test_off_unless_the_config_enables_it(exporter_with, sim):
    assert ask(exporter_with({}), sim.url).status_code == 404
    assert ask(exporter_with({"forensics": {"enabled": False}}), sim.url).status_code == 404


def test_a_target_that_is_not_hung_is_409_and_nothing_is_captured(exporter_with, sim, tmp_path):
    tool, mark = marking_py_spy(tmp_path)
    exporter = exporter_with(FAST | {"allow_targets": [sim.url], "forensics": {"enabled": True, "py_spy": tool}})
    answer = ask(exporter, sim.url)
    assert answer.status_code == 409, answer.text
    assert answer.json()["verdict"] == "idle" and answer.json()["processes"] == []
    assert not mark.exists()


def test_a_hung_target_is_captured(exporter_with, sim):
    sim.set_state("unresponsive")
    exporter = exporter_with(FAST | {"allow_targets": [sim.url], "forensics": {"enabled": True, "deadline": "8s"}})
    answer = ask(exporter, sim.url)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["verdict"] == "hung" and body["signature"] and body["captured_at"]
    assert [p for p in body["processes"] if p["pid"] == os.getpid() and p["threads"]], body["errors"]


def test_targets_are_held_to_the_allowlist_and_validated(exporter_with, sim):
    exporter = exporter_with(FAST | {"allow_targets": ["http://127.0.0.1:1"], "forensics": {"enabled": True}})
    assert ask(exporter, sim.url).status_code == 403
    assert ask(exporter, "file:///etc/passwd").status_code == 400


@pytest.mark.parametrize("data, key", [
    ({"forensics": {"enabled": "yes"}}, "forensics.enabled"),
    ({"forensics": {"deadline": "forever"}}, "forensics.deadline"),
    ({"forensics": {"enable": True}}, "forensics.enable"),
    ({"forensics": ["enabled"]}, "forensics"),
    ({"forensics": {"enabled": True}}, "forensics.enabled"),
    ({"allow_targets": ["http://127.0.0.1:8000"], "allow_any_target": True, "forensics": {"enabled": True}},
     "forensics.enabled"),
    ({"allow_targets": ["http://127.0.0.1:8000"], "forensics": {"enabled": True, "max_concurrent": 0}},
     "forensics.max_concurrent"),
    ({"allow_targets": ["http://127.0.0.1:8000"], "forensics": {"enabled": True, "pins": [
        {"url": "http://127.0.0.1:9000", "pid_file": "/run/x.pid"}]}}, r"forensics.pins\[0\].url"),
    ({"allow_targets": ["http://127.0.0.1:8000"], "forensics": {"enabled": True, "pins": [
        {"url": "http://127.0.0.1:8000", "pid_file": "/run/x.pid", "cgroup": "x"}]}}, r"forensics.pins\[0\]"),
])
def test_bad_forensics_config_names_the_key(data, key):
    with pytest.raises(ConfigError, match=key if "\\[" in key else key.replace(".", r"\.")):
        exporter_config(data)


def test_the_first_livez_503_of_an_incident_logs_the_stacks_once(exporter_with, sim, caplog):
    import json
    import logging
    import time
    caplog.set_level(logging.DEBUG, logger="hangwatch.exporter")
    exporter = exporter_with(FAST | {"allow_targets": [sim.url], "forensics": {"enabled": True, "min_interval": "0s"}})

    def livez():
        return requests.get(exporter + "/livez", params={"target": sim.url}, timeout=30).status_code

    def captures():
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("forensics after /livez 503")
                and r.levelno == logging.DEBUG]

    def wait_captures(n):
        deadline = time.monotonic() + 20
        while len(captures()) < n:
            assert time.monotonic() < deadline, captures()
            time.sleep(0.05)
    sim.set_state("unresponsive")
    assert [livez() for _ in range(3)] == [503, 503, 503]
    wait_captures(1)
    line = captures()[0]
    answer = json.loads(line.split(" capture=", 1)[1])
    assert answer["verdict"] == "hung" and [p for p in answer["processes"] if p["pid"] == os.getpid()]
    sim.set_state("idle")
    assert livez() == 200
    sim.set_state("unresponsive")
    assert livez() == 503
    wait_captures(2)
    assert len(captures()) == 2  # one per incident: three 503s in the first gave one capture

