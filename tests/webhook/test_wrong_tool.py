"""When a restart is the wrong tool: the server's log read before deciding, the class and policy
it names, alert_only (no restart, people told once per hung process), per-target overrides and
the escalation (once per incident, bounded, recorded)."""
from __future__ import annotations

import json
import sys

import pytest

from hangwatch.forensics.logsignatures import LOG_SIGNATURES
from hangwatch.incidents import render, summaries, table
from hangwatch.webhook.config import ConfigError

from .conftest import make_config
from .fakes import FakeClock, FakeRestarter, iso, payload

HARDWARE = next(r for r in LOG_SIGNATURES if r.name == "gpu_xid")
WEDGE = next(r for r in LOG_SIGNATURES if r.name == "vllm_shm_broadcast_stalled")


class SayingRestarter(FakeRestarter):
    """Fake containers whose Docker log (timestamped like Docker's) holds ``said[name]``, each line
    written ``age`` seconds after the container started (negative: before, i.e. a previous process)."""

    def __init__(self, clock, **kwargs):
        super().__init__(clock, **kwargs)
        self.said: dict[str, list[tuple[float, str]]] = {}

    def say(self, name: str, line: str, age: float = 1.0) -> None:
        self.said.setdefault(name, []).append((age, line))

    def log_tail(self, container, lines):
        started = container.started_at.timestamp()
        return [f"{iso(started + age)} {text}" for age, text in self.said.get(container.name, [])][-lines:]


def incidents(state_dir):
    return [json.loads(p.read_text()) for p in sorted((state_dir / "incidents").glob("*.json"))]


def ledger(state_dir, event):
    return [r for r in map(json.loads, (state_dir / "ledger.jsonl").read_text().splitlines()) if r["event"] == event]


@pytest.fixture
def saying(harness):
    def build(**config):
        clock = FakeClock()
        restarter = SayingRestarter(clock)
        return harness(clock=clock, restarter=restarter, **config), restarter
    return build


def test_a_hardware_line_keeps_the_hang_from_being_restarted_and_says_which_line(saying):
    h, docker = saying()
    docker.say("vllm-a", "INFO loading weights")
    docker.say("vllm-a", HARDWARE.example)
    assert h.post(payload(h.alert())).status_code == 200
    h.settle()
    assert docker.restarts == []
    [decision] = h.decisions()
    assert (decision["action"], decision["reason"], decision["class"], decision["policy"]) == \
        ("skip", "alert_only", "hardware", "alert_only")
    assert decision["log_signature"] == "gpu_xid" and "Xid" in decision["line"]
    [incident] = incidents(h.state_dir)
    assert incident["action"] == "alert_only" and incident["class"] == "hardware"
    assert incident["log_signature"]["line"] == HARDWARE.example
    assert ledger(h.state_dir, "restart") == []
    metrics = h.client.get("/metrics").get_data(as_text=True)
    assert 'hangwatch_webhook_alert_only_total{class="hardware",target="vllm-a"} 1.0' in metrics
    [summary] = summaries(str(h.state_dir))
    assert (summary.signature, summary.klass, summary.policy, summary.action) == \
        ("gpu_xid", "hardware", "alert_only", "alert_only")
    assert table([summary]).splitlines()[1].split()[4:8] == ["gpu_xid", "hardware", "alert_only", "alert_only"]
    shown = render(incident, summary.id)
    assert "class:      hardware, policy alert_only (not restarted" in shown and HARDWARE.example in shown


def test_a_resent_alert_about_the_same_process_is_counted_not_told_again(saying):
    h, docker = saying()
    docker.say("vllm-a", HARDWARE.example)
    for _ in range(3):
        assert h.post(payload(h.alert())).status_code == 200
        h.settle()
    assert docker.restarts == []
    assert [d["reason"] for d in h.decisions()] == ["alert_only"] * 3
    assert len(incidents(h.state_dir)) == 1 and len(ledger(h.state_dir, "alert_only")) == 1
    assert "already told" in h.decisions()[-1]["detail"]


def test_an_engine_wedge_line_is_restarted_and_named(saying):
    h, docker = saying()
    docker.say("vllm-a", WEDGE.example)
    assert h.post(payload(h.alert())).status_code == 200
    h.settle()
    assert [name for name, _ in docker.restarts] == ["vllm-a"]
    [decision] = h.decisions()
    assert (decision["reason"], decision["class"], decision["policy"], decision["log_signature"]) == \
        ("hung", "engine_wedge", "restart", "vllm_shm_broadcast_stalled")
    [incident] = incidents(h.state_dir)
    assert incident["class"] == "engine_wedge" and incident["log_signature"]["name"] == WEDGE.name


def test_a_line_the_previous_process_wrote_does_not_count(saying):
    h, docker = saying()
    docker.say("vllm-a", HARDWARE.example, age=-30)  # before the container's last start
    h.post(payload(h.alert()))
    h.settle()
    assert [name for name, _ in docker.restarts] == ["vllm-a"]
    assert h.decisions()[0]["class"] == "unknown" and "log_signature" not in h.decisions()[0]


def test_a_target_overrides_the_policy_of_a_class(saying):
    targets = [{"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000",
                "policy": {"hardware": "restart", "engine_wedge": "alert_only"}},
               {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001"}]
    h, docker = saying(targets=targets)
    docker.say("vllm-a", HARDWARE.example)
    h.post(payload(h.alert()))
    h.settle()
    assert [name for name, _ in docker.restarts] == ["vllm-a"]
    assert (h.decisions()[-1]["class"], h.decisions()[-1]["policy"]) == ("hardware", "restart")


def test_an_override_makes_a_stack_signature_alert_only_and_an_unknown_one_is_invalid(harness):
    targets = [{"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000",
                "forensics_url": "http://127.0.0.1:9877", "policy": {"collective_timeout": "alert_only"}},
               {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001",
                "forensics_url": "http://127.0.0.1:9877"}]
    answers = {"http://127.0.0.1:18000": "nccl_collective", "http://127.0.0.1:18001": "made_up_by_a_capture"}

    def capture(forensics_url, target_url, timeout, token=None, container=None):
        return {"signature": answers[target_url], "processes": [], "errors": []}

    h = harness(forensics=capture, targets=targets)
    h.post(payload(h.alert(), h.alert(target="vllm-b", container="vllm-b")))
    h.settle()
    by_target = {d["target"]: d for d in h.decisions()}
    assert (by_target["vllm-a"]["reason"], by_target["vllm-a"]["class"]) == ("alert_only", "collective_timeout")
    assert by_target["vllm-a"]["signature"] == "nccl_collective"
    assert (by_target["vllm-b"]["reason"], by_target["vllm-b"]["class"]) == ("hung", "invalid")
    assert [name for name, _ in h.restarter.restarts] == ["vllm-b"]


@pytest.mark.parametrize("policy, key", [
    ({"hardwear": "alert_only"}, "targets[0].policy.hardwear: unknown key"),
    ({"hardware": "page"}, "targets[0].policy.hardware: expected one of restart, alert_only"),
])
def test_a_bad_policy_is_refused_naming_the_key(tmp_path, policy, key):
    targets = [{"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000", "policy": policy}]
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        make_config(tmp_path, targets=targets)


@pytest.mark.parametrize("escalate, key", [
    ({"command": ["true"], "url": "http://127.0.0.1:1/hook"}, "escalate: expected exactly one of"),
    ({"command": "kubectl cordon node-3"}, "escalate.command: expected a list"),
    ({"url": "ftp://x/hook"}, "escalate.url"),
    ({"command": ["true"], "timeout": "0s"}, "escalate.timeout"),
])
def test_a_bad_escalate_is_refused_naming_the_key(tmp_path, escalate, key):
    with pytest.raises(ConfigError, match=key):
        make_config(tmp_path, escalate=escalate)


def recorder(tmp_path, body: str = "") -> list[str]:
    """argv of a command that appends its stdin (the incident) and environment to a file."""
    out = tmp_path / "escalated.jsonl"
    script = tmp_path / "escalate.py"
    script.write_text("import json, os, sys\n"
                      f"record = {{'stdin': json.load(sys.stdin), 'reason': os.environ['HANGWATCH_REASON'],"
                      f" 'target': os.environ['HANGWATCH_TARGET']}}\n"
                      f"open({str(out)!r}, 'a').write(json.dumps(record) + '\\n')\n{body}")
    return [sys.executable, str(script)]


def escalated(tmp_path) -> list[dict]:
    path = tmp_path / "escalated.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_alert_only_escalates_once_with_the_incident(saying, tmp_path):
    h, docker = saying(escalate={"command": recorder(tmp_path), "timeout": "10s"})
    docker.say("vllm-a", HARDWARE.example)
    for _ in range(2):
        h.post(payload(h.alert()))
        h.settle()
    [run] = escalated(tmp_path)
    assert run["reason"] == "alert_only" and run["target"] == "vllm-a"
    assert run["stdin"]["class"] == "hardware" and run["stdin"]["log_signature"]["name"] == "gpu_xid"
    outcomes = [(r["outcome"], r["reason"]) for r in ledger(h.state_dir, "escalation")]
    assert outcomes == [("started", "alert_only"), ("ok", "alert_only")]
    assert 'hangwatch_webhook_escalations_total{outcome="ok"} 1.0' in h.client.get("/metrics").get_data(as_text=True)


def test_the_circuit_opening_escalates_once(saying, tmp_path):
    h, docker = saying(escalate={"command": recorder(tmp_path)}, cooldown="0s", budget={"restarts": 2, "window": "1h"})
    for _ in range(4):
        h.post(payload(h.alert()))
        h.settle()
        h.clock.advance(120)
    assert len(docker.restarts) == 2
    [run] = escalated(tmp_path)
    assert run["reason"] == "circuit_open" and run["stdin"]["target"] == "vllm-a"
    assert [d["reason"] for d in h.decisions()][-2:] == ["circuit_open", "circuit_open"]


@pytest.mark.parametrize("body, outcome", [("sys.exit(3)\n", "failed"), ("import time; time.sleep(60)\n", "timeout")])
def test_a_failing_or_hanging_escalation_is_bounded_and_recorded(saying, tmp_path, body, outcome):
    import time
    h, docker = saying(escalate={"command": recorder(tmp_path, body), "timeout": "1s"})
    docker.say("vllm-a", HARDWARE.example)
    began = time.monotonic()
    h.post(payload(h.alert()))
    h.settle(30)
    assert time.monotonic() - began < 15
    assert [r["outcome"] for r in ledger(h.state_dir, "escalation")] == ["started", outcome]
    assert docker.restarts == []


def test_an_escalation_command_that_cannot_start_is_an_error(saying, tmp_path):
    h, docker = saying(escalate={"command": [str(tmp_path / "no-such-command")]})
    docker.say("vllm-a", HARDWARE.example)
    h.post(payload(h.alert()))
    h.settle()
    assert [r["outcome"] for r in ledger(h.state_dir, "escalation")] == ["started", "error"]


def down_alert(h, **labels):
    return h.alert(alertname="HangwatchBackendDown", **labels)


def startup_targets(deadline="10m"):
    return [{"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000", "startup_deadline": deadline},
            {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001"}]


def test_a_startup_that_never_finishes_is_restarted_once_then_alerted_only(saying):
    h, docker = saying(targets=startup_targets(), cooldown="0s")
    h.rechecker.state = "down"
    docker.say("vllm-a", "INFO Capturing CUDA graphs (decode, FULL)")
    h.post(payload(down_alert(h)))
    h.settle()
    assert [name for name, _ in docker.restarts] == ["vllm-a"]
    assert [(d["action"], d["reason"]) for d in h.decisions()] == [("restart", "startup_stuck")]
    assert ledger(h.state_dir, "restart")[0]["verdict"] == "startup_stuck"
    h.post(payload(down_alert(h)))  # the restarted process: up for less than the deadline
    h.settle()
    assert h.decisions()[-1]["reason"] == "recheck_down" and "still loading" in h.decisions()[-1]["detail"]
    h.clock.advance(601)
    for _ in range(2):
        h.post(payload(down_alert(h)))
        h.settle()
    assert len(docker.restarts) == 1
    assert [(d["reason"], d.get("class")) for d in h.decisions()[-2:]] == [("alert_only", "startup")] * 2
    [incident] = [i for i in incidents(h.state_dir) if i.get("action") == "alert_only"]
    assert (incident["signature"], incident["class"], incident["policy"]) == ("startup_stuck", "startup", "alert_only")


def test_a_startup_that_still_logs_or_is_young_is_left_loading(saying):
    h, docker = saying(targets=startup_targets("2h"))
    h.rechecker.state = "down"
    h.post(payload(down_alert(h)))
    h.settle()
    assert h.decisions()[-1]["reason"] == "recheck_down" and "within startup_deadline" in h.decisions()[-1]["detail"]
    h2, docker2 = saying(targets=startup_targets("10m"), state_dir=h.state_dir.parent / "state2")
    h2.rechecker.state = "down"
    docker2.say("vllm-a", "INFO Loading weights 71%", age=3600)  # written now: it is still loading
    h2.post(payload(down_alert(h2)))
    h2.settle()
    assert docker.restarts == [] and docker2.restarts == []
    assert "still logs" in h2.decisions()[-1]["detail"]


def test_a_down_alert_is_ignored_where_no_startup_deadline_opts_in(saying):
    h, docker = saying()
    h.rechecker.state = "down"
    h.post(payload(down_alert(h)))
    h.settle()
    assert docker.restarts == [] and h.rechecker.calls == []


def test_compaction_keeps_who_was_told_and_what_was_escalated(tmp_path):
    from hangwatch.webhook.ledger import Ledger
    ledger_ = Ledger(str(tmp_path / "state"), rotate_bytes=4096)
    ledger_.append({"event": "alert_only", "at": 1.0, "target": "vllm-a", "key": "c1@t", "incident": "/i/1.json"})
    ledger_.append({"event": "escalation", "at": 1.0, "target": "vllm-a", "key": "alert_only:c1@t",
                    "outcome": "started"})
    for i in range(100):  # decisions only: compaction drops them all
        ledger_.append({"event": "decision", "at": 2.0 + i, "target": "vllm-a", "action": "skip",
                        "reason": "alert_only", "detail": "x" * 60})
    assert (tmp_path / "state" / "ledger.jsonl.1").exists(), "never compacted"
    again = Ledger(str(tmp_path / "state"), rotate_bytes=4096)
    assert again.told("vllm-a", "c1@t") == "/i/1.json" and again.escalated("vllm-a", "alert_only:c1@t")
