"""`hangwatch forensics URL` captures only a hung target; `hangwatch incidents` reads the webhook's records."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hangwatch.simulator import Simulator
from hangwatch.webhook.ledger import Ledger
from hangwatch.webhook.statedir import write_incident


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


def hangwatch(*args, timeout=90):
    return subprocess.run([sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True, timeout=timeout)


def marking_py_spy(tmp_path):
    """A py-spy that leaves a mark when run (and then fails): proof of whether a capture was tried."""
    mark = tmp_path / "py-spy-ran"
    tool = tmp_path / "py-spy"
    tool.write_text(f"#!/bin/sh\ntouch {mark}\necho 'Error: Failed to find python version' >&2\nexit 1\n")
    tool.chmod(0o755)
    return str(tool), mark


@pytest.mark.parametrize("state, params, verdict", [("idle", {}, "idle"), ("busy", {"n": 2}, "busy"),
                                                     ("dead", {}, "down")])
def test_a_target_that_is_not_hung_is_refused_and_nothing_is_captured(sim, tmp_path, state, params, verdict):
    sim.set_state(state, **params)
    tool, mark = marking_py_spy(tmp_path)
    done = hangwatch("forensics", sim.url, "--json", "--interval", "0.3", "--timeout", "1", "--py-spy", tool)
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["verdict"] == verdict and answer["captured"] is False and answer["processes"] == []
    assert not mark.exists()


def test_a_hung_target_is_captured_from_its_url(sim):
    sim.set_state("unresponsive")
    done = hangwatch("forensics", sim.url, "--json", "--interval", "0.3", "--timeout", "0.5", "--deadline", "8")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert {"verdict", "signature", "captured_at", "processes", "errors"} <= set(answer)
    assert answer["verdict"] == "hung" and answer["captured"] is True
    # the simulator runs inside this test's process: that is the process listening on its port
    ours = [p for p in answer["processes"] if p["pid"] == os.getpid()]
    assert ours and ours[0]["threads"], answer["errors"]
    frames = {f["name"] for t in ours[0]["threads"] for f in t["frames"]}
    assert any("test_a_hung_target_is_captured_from_its_url" in name for name in frames)
    assert answer["signature"] in ("unknown", "gil_holder") and answer["evidence"]
    # the capturing command is this process's child, but never part of its own capture
    assert [p["pid"] for p in answer["processes"]] == [os.getpid()]


def test_the_human_form_leads_with_the_signature(sim):
    sim.set_state("unresponsive")
    done = hangwatch("forensics", sim.url, "--interval", "0.3", "--timeout", "0.5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("hung:") and lines[1].startswith("signature: ")
    assert any(line.startswith(f"  process {os.getpid()} ") for line in lines)


def incident(state_dir, name, *, target="vllm-a", signature="engine_step_stuck", group=None):
    record = {"target": target, "container": target, "url": "http://127.0.0.1:8000", "group": group,
              "decided_at": f"2026-12-03T10:0{name[-1]}:00Z", "recheck": {"verdict": "hung", "reason": "frozen"},
              "observations": [{"status": "ok", "reading": {"in_flight": 2, "running": 2, "waiting": 0}}],
              "signature": signature, "logs": ["INFO started"],
              "forensics": {"signature": signature, "cause": "EngineCore never returns from a step",
                            "evidence": ["pid 200 (VLLM::EngineCore) thread MainThread: wedged"], "errors": [],
                            "processes": [{"pid": 200, "name": "VLLM::EngineCore", "state": "S", "threads": [
                                {"name": "MainThread", "frames": [{"name": "hangwatch_fault_wedged_here",
                                                                   "file": "wedge.py", "line": 9}]}]}]}}
    return write_incident(str(state_dir), name, record)


def test_incidents_list_show_and_json(tmp_path):
    ledger = Ledger(str(tmp_path))
    paths = [incident(tmp_path, f"2026120{i}-vllm-a-1", group="g" if i == 2 else None) for i in (1, 2, 3)]
    for at, path in zip((10.0, 20.0, 30.0), paths):
        ledger.append({"event": "restart", "at": at, "target": "vllm-a", "incident": path})
        ledger.append({"event": "decision", "at": at, "target": "vllm-a", "action": "restart", "reason": "hung",
                       "result": "ok", "incident": path})
    ledger.append({"event": "recovered", "at": 25.0, "target": "vllm-a", "restart_at": 20.0})
    listed = hangwatch("incidents", "--state-dir", str(tmp_path), "--last", "2", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["id"] for r in rows] == ["20261202-vllm-a-1", "20261203-vllm-a-1"]
    assert rows[0]["signature"] == "engine_step_stuck"
    assert (rows[0]["recovered"], rows[1]["recovered"]) == (True, None)
    assert rows[0]["outcome"] == "ok" and rows[0]["verdict"] == "hung"
    table = hangwatch("incidents", "--state-dir", str(tmp_path))
    assert table.stdout.splitlines()[0].split()[:5] == ["ID", "TIME", "TARGET", "VERDICT", "SIGNATURE"]
    assert len(table.stdout.splitlines()) == 4
    shown = hangwatch("incidents", "show", "20261202-vllm-a-1", "--state-dir", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "signature:  engine_step_stuck" in shown.stdout and "hangwatch_fault_wedged_here" in shown.stdout
    assert "in_flight=2" in shown.stdout


def test_incidents_from_the_environment_and_bad_ids(tmp_path):
    Ledger(str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "hangwatch", "incidents", "show", "../../etc/passwd"],
                          capture_output=True, text=True, env=os.environ | {"HANGWATCH_STATE_DIR": str(tmp_path)})
    assert done.returncode == 1 and "not an incident ID" in done.stderr
    missing = hangwatch("incidents", "show", "nope", "--state-dir", str(tmp_path))
    assert missing.returncode == 1 and "no incident 'nope'" in missing.stderr
    assert hangwatch("incidents", "frobnicate", "--state-dir", str(tmp_path)).returncode == 64
