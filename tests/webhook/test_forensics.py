"""Before a restart the webhook asks the target's forensics place for the stacks: once, within
its deadline, the signature in the incident, the decision line and the ledger; the restart goes
on whatever the capture does."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from hangwatch.demo.files import private_file
from hangwatch.webhook.config import ConfigError, parse_config
from hangwatch.webhook.forensics import ask

from .conftest import Harness
from .fakes import FakeRechecker, payload

CAPTURE = {"verdict": "hung", "signature": "engine_step_stuck", "captured_at": "2026-12-03T10:00:00Z",
           "cause": "EngineCore never returns", "evidence": ["pid 200 (VLLM::EngineCore): hangwatch_fault_wedged_here"],
           "processes": [{"pid": 200, "name": "VLLM::EngineCore", "state": "S", "threads": [
               {"name": "MainThread", "frames": [{"name": "hangwatch_fault_wedged_here", "file": "w.py", "line": 1}]}]}],
           "errors": []}
TARGETS = [{"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000",
            "forensics_url": "http://127.0.0.1:9877"},
           {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001"}]


class Capturer:
    def __init__(self, answer=CAPTURE):
        self.calls, self.answer = [], answer

    def __call__(self, forensics_url, target_url, timeout, *, token=None, container=None):
        self.calls.append((forensics_url, target_url, timeout))
        self.asked = {"token": token, "container": container}
        return self.answer


@pytest.fixture
def built(tmp_path):
    made = []

    def build(forensics, rechecker=None, **config):
        h = Harness(tmp_path / "state", rechecker=rechecker, forensics=forensics, targets=TARGETS, **config)
        made.append(h)
        return h
    yield build
    for h in made:
        h.close()


def incident_of(h):
    (path,) = (h.state_dir / "incidents").glob("*.json")
    return json.loads(path.read_text())


def test_the_stacks_and_signature_go_into_the_incident_and_the_decision(built, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    capturer = Capturer()
    h = built(capturer, forensics_timeout="12s")
    h.post(payload(h.alert()))
    h.settle()
    assert capturer.calls == [("http://127.0.0.1:9877", "http://127.0.0.1:18000", 12.0)]
    assert h.restarter.restarts == [("vllm-a", 30)]
    record = incident_of(h)
    assert record["signature"] == "engine_step_stuck"
    assert record["forensics"]["processes"][0]["threads"][0]["frames"][0]["name"] == "hangwatch_fault_wedged_here"
    (decision,) = h.decisions()
    assert decision["signature"] == "engine_step_stuck" and decision["action"] == "restart"
    assert any("signature=engine_step_stuck" in r.getMessage() for r in caplog.records)


def test_once_per_incident_whatever_the_alert_resends(built):
    capturer = Capturer()
    h = built(capturer)
    body = payload(h.alert())
    for _ in range(3):
        h.post(body)
        h.settle()
        h.clock.advance(1)
    assert len(capturer.calls) == 1 and len(h.restarter.restarts) == 1


@pytest.mark.parametrize("state", ["busy", "idle", "down"])
def test_no_capture_is_asked_unless_the_recheck_said_hung(built, state):
    capturer = Capturer()
    h = built(capturer, rechecker=FakeRechecker(state))
    h.post(payload(h.alert()))
    h.settle()
    assert capturer.calls == [] and h.restarter.restarts == []


def test_a_target_without_forensics_url_is_restarted_without_asking(built):
    capturer = Capturer()
    h = built(capturer)
    h.post(payload(h.alert(target="vllm-b", container="vllm-b")))
    h.settle()
    assert capturer.calls == [] and h.restarter.restarts == [("vllm-b", 30)]
    assert "signature" not in incident_of(h) and "signature" not in h.decisions()[0]


def test_a_failing_capture_never_stops_the_restart(built):
    def broken(*args, **asked):
        raise RuntimeError("boom")
    h = built(broken)
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == [("vllm-a", 30)]
    record = incident_of(h)
    assert record["signature"] is None and "boom" in record["forensics"]["errors"][0]
    assert h.decisions()[0]["signature"] == "none"


@pytest.fixture
def silent_server():
    """Accepts connections and never answers (a capture whose py-spy never returns, seen from outside)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    for conn in held:
        conn.close()
    listener.close()


def test_a_capture_that_never_answers_is_cut_at_its_deadline(silent_server):
    started = time.monotonic()
    answer = ask(silent_server, "http://127.0.0.1:8000", timeout=1.0)
    assert time.monotonic() - started < 3.0
    assert answer["signature"] is None and "did not answer within 1s" in answer["errors"][0]


def test_the_restart_comes_on_time_when_the_capture_hangs(tmp_path, silent_server):
    targets = [dict(TARGETS[0], forensics_url=silent_server), TARGETS[1]]
    h = Harness(tmp_path / "state", targets=targets, forensics_timeout="1.5s")
    try:
        started = time.monotonic()
        h.post(payload(h.alert()))
        h.settle(timeout=20)
        assert time.monotonic() - started < 1.5 + 3.0
        assert h.restarter.restarts == [("vllm-a", 30)]
        assert "did not answer within 1.5s" in incident_of(h)["forensics"]["errors"][0]
    finally:
        h.close()


@pytest.mark.parametrize("raw, key", [
    ({"forensics_url": "ftp://x"}, "targets[0].forensics_url"),
    ({"forensics_url": 5}, "targets[0].forensics_url"),
])
def test_bad_forensics_config_names_the_key(tmp_path, raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        parse_config({"state_dir": str(tmp_path), "targets": [dict(TARGETS[0], **raw)]})
    with pytest.raises(ConfigError, match="forensics_timeout"):
        parse_config({"state_dir": str(tmp_path), "forensics_timeout": "never", "targets": [TARGETS[1]]})


def test_no_api_key_or_token_reaches_the_incident_whatever_the_capture_answers(built, tmp_path):
    key = "sk-target-key-0123456789abcdef"
    private_file(tmp_path / "key", key)
    leaky = dict(CAPTURE, evidence=[f"pid 1: local api_key={key!r}", "header Bearer abcdefghijklmnop0123"])
    targets = [dict(TARGETS[0], api_key_file=str(tmp_path / "key")), TARGETS[1]]
    h = Harness(tmp_path / "state2", forensics=Capturer(leaky), targets=targets)
    try:
        h.post(payload(h.alert()))
        h.settle()
        assert h.restarter.restarts == [("vllm-a", 30)]
        texts = [p.read_text() for p in (h.state_dir / "incidents").glob("*.json")]
        texts.append((h.state_dir / "ledger.jsonl").read_text())
        assert texts[0] and not any(key in t or "abcdefghijklmnop0123" in t for t in texts)
        assert "<redacted>" in texts[0]
    finally:
        h.close()
