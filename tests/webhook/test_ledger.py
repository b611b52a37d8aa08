"""The ledger is the webhook's memory: what it forgets, the webhook repeats (a second restart
inside a cooldown, a circuit that will not close). These tests break it the ways disks and
crashes do — a torn last line, a write cut short by a full disk — and grow it the way months
of alerts do, and check that no decision is lost, no restart happens without its record, and
reading it costs memory for what the decisions need, not for its size.

A full disk is real here: the write runs in a child process whose ``RLIMIT_FSIZE`` stops the
file at a given size (the kernel then writes short, then fails with EFBIG).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

from hangwatch.webhook.ledger import Ledger, LedgerError

from .fakes import auth, payload
from .real_parts import REPO

TORN = b'{"action": "skip", "at": 1799999000.5, "event": "deci'  # a crash mid-write


def lines_parse(path) -> bool:
    data = path.read_bytes()
    return data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())


def test_a_torn_last_line_cannot_swallow_the_next_restart(harness, caplog):
    """Before: the first restart's record fused with the garbage, was skipped, and a second
    restart followed 10 minutes later, inside the 15-minute cooldown."""
    h = harness()
    (h.state_dir / "ledger.jsonl").write_bytes(TORN)
    h.post(payload(h.alert()))
    h.settle()
    h.clock.advance(600)  # hung again: a new alert, begun after the restart
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 1
    assert [d["reason"] for d in h.decisions()] == ["hung", "cooldown"]
    assert lines_parse(h.state_dir / "ledger.jsonl")
    # The repair is told (a warning naming the ledger), not silent; its wording is no interface.
    assert any(r.levelno == logging.WARNING and "ledger.jsonl" in r.getMessage() for r in caplog.records)


def test_a_torn_last_line_cannot_swallow_a_circuit_reset(harness):
    """Before: the endpoint answered reset: true and the circuit stayed open."""
    h = harness(cooldown="0s", budget={"restarts": 1, "window": "1h"})
    h.post(payload(h.alert()))
    h.settle()
    with open(h.state_dir / "ledger.jsonl", "ab") as ledger:
        ledger.write(TORN)
    answer = h.client.post("/circuit/vllm-a/reset", headers=auth())
    assert answer.status_code == 200 and answer.get_json()["reset"] is True
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 0.0' in h.client.get("/metrics").text
    h.clock.advance(120)
    h.post(payload(h.alert()))
    h.settle()
    assert len(h.restarter.restarts) == 2


def test_a_reset_that_cannot_be_recorded_is_refused_not_claimed(harness, monkeypatch):
    h = harness(cooldown="0s", budget={"restarts": 1, "window": "1h"})
    h.post(payload(h.alert()))
    h.settle()

    def full(record):
        raise LedgerError("cannot write ledger.jsonl: No space left on device")
    monkeypatch.setattr(h.state.ledger, "append", full)
    answer = h.client.post("/circuit/vllm-a/reset", headers=auth())
    assert answer.status_code == 503 and "reset" not in answer.get_json()
    assert 'hangwatch_webhook_circuit_open{target="vllm-a"} 1.0' in h.client.get("/metrics").text


def test_no_restart_without_its_ledger_record(harness, monkeypatch, caplog):
    h = harness()
    real_append = h.state.ledger.append

    def append(record):
        if record["event"] == "restart":
            raise LedgerError("cannot write ledger.jsonl: No space left on device")
        real_append(record)
    monkeypatch.setattr(h.state.ledger, "append", append)
    h.post(payload(h.alert()))
    h.settle()
    assert h.restarter.restarts == []
    assert [(d["action"], d["reason"]) for d in h.decisions()] == [("skip", "ledger_error")]
    assert any(r.levelno == logging.ERROR and "reason=ledger_error" in r.getMessage() for r in caplog.records)


def run_child(code: str, tmp_path) -> dict:
    """Run ``code`` in a child Python (the repository on its path); its last stdout line is JSON."""
    script = "import json, os, resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n" + \
        textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_write_cut_short_by_a_full_disk_is_undone_and_reported(tmp_path):
    """Before: the short write went unnoticed; the next record fused with its half and the
    restart it recorded was forgotten."""
    result = run_child("""
        from hangwatch.webhook.ledger import Ledger
        state = sys.argv[1] + "/state"
        ledger = Ledger(state)
        ledger.append({"event": "restart", "at": 1000.0, "target": "a"})
        path = state + "/ledger.jsonl"
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 20, hard))  # the disk is full
        try:
            ledger.append({"event": "restart", "at": 2000.0, "target": "a", "note": "x" * 100})
            raised = None
        except Exception as exc:
            raised = type(exc).__name__
        size_after = os.path.getsize(path)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
        ledger.append({"event": "restart", "at": 3000.0, "target": "a"})
        print(json.dumps({"raised": raised, "size_after": size_after, "last": Ledger(state).last_restart("a"),
                          "lines": open(path).read().splitlines()}))
    """, tmp_path)
    assert result["raised"] == "LedgerError"
    assert result["last"] == 3000.0
    assert [json.loads(line)["at"] for line in result["lines"]] == [1000.0, 3000.0]


def test_a_full_disk_means_no_restart(tmp_path):
    """The incident record fits, the ledger's restart line does not: fail closed."""
    result = run_child("""
        from tests.webhook.conftest import Harness
        from tests.webhook.fakes import payload
        import pathlib
        state = pathlib.Path(sys.argv[1]) / "state"
        state.mkdir()
        filler = json.dumps({"event": "decision", "at": 1.0, "reason": "cooldown", "detail": "y" * 300}) + "\\n"
        (state / "ledger.jsonl").write_text(filler * 190)  # ~64 KB of history
        h = Harness(state)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, ((state / "ledger.jsonl").stat().st_size + 60, hard))
        h.post(payload(h.alert()))
        h.settle()
        metrics = h.client.get("/metrics").text
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        incidents = list((state / "incidents").glob("*.json"))
        data = (state / "ledger.jsonl").read_bytes()
        print(json.dumps({"restarts": len(h.restarter.restarts), "incidents": len(incidents),
                          "ledger_error": 'reason="ledger_error"} 1.0' in metrics, "whole": data.endswith(b"\\n")}))
    """, tmp_path)
    assert result == {"restarts": 0, "incidents": 1, "ledger_error": True, "whole": True}


def write_history(path, megabytes: float, restarts_every: int = 5000) -> float:
    """A ledger of ``megabytes`` like months of alerts: decision lines and now and then a restart."""
    at = 1_700_000_000.0
    chunk = []
    with open(path, "w") as handle:
        i = 0
        while handle.tell() < megabytes * 1e6:
            at += 5
            i += 1
            if i % restarts_every == 0:
                record = {"event": "restart", "at": at, "target": "vllm-a", "container": "vllm-a",
                          "replica": "h-1", "incident": "/var/lib/hangwatch/incidents/x.json"}
            else:
                record = {"event": "decision", "at": at, "replica": "host-1", "alertname": "HangwatchBackendHung",
                          "target": "vllm-a", "container": "vllm-a", "action": "skip", "reason": "resolved",
                          "dry_run": False, "detail": "container started 2026-11-30T03:00:00Z, after the alert began"}
            chunk.append(json.dumps(record, sort_keys=True) + "\n")
            if len(chunk) == 1000:
                handle.write("".join(chunk))
                chunk = []
        handle.write("".join(chunk))
    return at


def test_a_big_ledger_is_read_line_by_line_and_compacted(tmp_path):
    """Before: a 186 MB ledger was read whole (404 MB RSS). Now a 40 MB one costs a few MB,
    and is compacted at start-up to what cooldown, budget and circuit need."""
    state = tmp_path / "state"
    state.mkdir()
    write_history(state / "ledger.jsonl", 40)
    result = run_child("""
        import time
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        from hangwatch.webhook.ledger import Ledger
        import hangwatch.webhook.app  # everything the webhook imports, before measuring
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        ledger = Ledger(sys.argv[1] + "/state")
        took = time.monotonic() - started
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        print(json.dumps({"grew_mb": grew, "seconds": took, "last": ledger.last_restart("vllm-a")}))
    """, tmp_path)
    assert result["grew_mb"] < 20, result
    kept = [json.loads(line) for line in (state / "ledger.jsonl").read_text().splitlines()]
    assert kept[0]["event"] == "compacted" and kept[-1]["event"] == "restart"
    assert kept[-1]["at"] == result["last"]
    assert (state / "ledger.jsonl").stat().st_size < 10_000
    assert (state / "ledger.jsonl.1").stat().st_size > 40e6, "the previous ledger is kept for people"


def test_memory_holds_only_the_restarts_that_can_still_count(tmp_path):
    ledger = Ledger(str(tmp_path / "state"), keep=3600)
    for hour in range(500):  # one restart an hour for three weeks
        ledger.append({"event": "restart", "at": 1_000_000.0 + 3600 * hour, "target": "vllm-a"})
    now = 1_000_000.0 + 3600 * 499
    assert ledger.last_restart("vllm-a") == now
    assert ledger.restarts_counted("vllm-a", now + 1, 3600) == [now]
    assert len(ledger.restarts_since(0)) <= 3  # every restart it still holds, through its public reader


def test_two_replicas_share_a_ledger_that_is_compacted_under_them(tmp_path):
    state = str(tmp_path / "state")
    one = Ledger(state, keep=3600, rotate_bytes=20_000)
    two = Ledger(state, keep=3600, rotate_bytes=20_000)
    one.append({"event": "restart", "at": 10_000.0, "target": "vllm-a", "incident": "/x/1.json"})
    one.append({"event": "circuit_reset", "at": 10_001.0, "target": "vllm-a"})
    one.append({"event": "restart", "at": 10_002.0, "target": "vllm-b"})
    two.refresh()
    inode = os.stat(os.path.join(state, "ledger.jsonl")).st_ino
    for i in range(200):  # decision lines until one of them compacts the file
        (one if i % 2 else two).append({"event": "decision", "at": 10_003.0 + i, "target": "vllm-a",
                                        "reason": "cooldown", "detail": "z" * 100})
    assert os.stat(os.path.join(state, "ledger.jsonl")).st_ino != inode, "never compacted"
    assert os.path.getsize(os.path.join(state, "ledger.jsonl")) < 20_000
    # Another replica, appending after the compaction, writes to the new file; both still agree.
    two.append({"event": "restart", "at": 10_500.0, "target": "vllm-a"})
    for replica in (one, two):
        replica.refresh()
        assert replica.last_restart("vllm-a") == 10_500.0 and replica.last_restart("vllm-b") == 10_002.0
        assert replica.reset_at("vllm-a") == 10_001.0
        assert replica.restarts_counted("vllm-a", 10_600.0, 3600) == [10_500.0]  # the one before the reset does not
    fresh = Ledger(state, keep=3600)
    assert fresh.last_restart("vllm-a") == 10_500.0 and fresh.reset_at("vllm-a") == 10_001.0
    assert lines_parse(tmp_path / "state" / "ledger.jsonl")


def test_replicas_appending_at_once_lose_no_line(tmp_path):
    state = str(tmp_path / "state")
    replicas = [Ledger(state, keep=3600, rotate_bytes=30_000) for _ in range(3)]

    def write(n, ledger):
        for i in range(60):
            ledger.append({"event": "restart", "at": 20_000.0 + n * 1000 + i, "target": f"t{n}"})
    threads = [threading.Thread(target=write, args=(n, ledger)) for n, ledger in enumerate(replicas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fresh = Ledger(state, keep=3600)
    assert [fresh.last_restart(f"t{n}") for n in range(3)] == [20_059.0, 21_059.0, 22_059.0]
    assert all(len(fresh.restarts_counted(f"t{n}", 23_000.0, 3600)) == 60 for n in range(3))


def test_compaction_without_hard_links_still_keeps_the_previous_file(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_links)
    state = str(tmp_path / "state")
    ledger = Ledger(state, keep=3600, rotate_bytes=5_000)
    ledger.append({"event": "restart", "at": 5_000.0, "target": "vllm-a"})
    for i in range(60):
        ledger.append({"event": "decision", "at": 5_001.0 + i, "target": "vllm-a", "detail": "q" * 100})
    assert os.path.getsize(os.path.join(state, "ledger.jsonl.1")) >= 5_000
    assert os.path.getsize(os.path.join(state, "ledger.jsonl")) < 5_000
    assert Ledger(state).last_restart("vllm-a") == 5_000.0
