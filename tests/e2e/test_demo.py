"""``hangwatch demo``, the one-command local demo, does what the README promises: a busy phase
with no probe and no alert, then a hang that ends in exactly one (dry-run) restart decision;
and every process it started is gone afterwards. It runs as the README says: the ``hangwatch``
command of a plain ``pip install .``, from the checkout's root (where ``python -m demo`` once died
with ``No module named 'hangwatch.rules'``)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import REPO
from tests.support.require import require_binary
from tests.support.wheel import plain_install

pytestmark = pytest.mark.real

PROMISES = ("ok   busy phase: no probe sent", "ok   busy phase: no alert",
            "ok   hang: exactly one restart decision (dry-run)", "ok   hang: nothing actually restarted (dry-run)")


def run_demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(plain_install() / "bin" / "hangwatch"), "demo", "--busy", "8s", "--idle", "4s", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def pids_in(output: str) -> list[int]:
    return [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in output.splitlines() if "(pid " in line]


def test_demo_with_prometheus_and_alertmanager(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    done = run_demo()
    assert done.returncode == 0, done.stdout + done.stderr
    for promise in PROMISES:
        assert promise in done.stdout, done.stdout
    assert "alertmanager HangwatchBackendHung active → receiver hangwatch-webhook" in done.stdout
    decisions = [line for line in done.stdout.splitlines() if "] webhook " in line and "action=restart" in line]
    assert len(decisions) == 1 and "dry_run=true" in decisions[0] and "reason=hung" in decisions[0]
    pids = pids_in(done.stdout)
    assert len(pids) == 5
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "the demo left processes running"


def test_demo_without_prometheus_still_shows_the_chain():
    done = run_demo("--no-prometheus")
    assert done.returncode == 0, done.stdout + done.stderr
    for promise in PROMISES:
        assert promise in done.stdout, done.stdout
    assert "no Prometheus: hangwatch check says hung" in done.stdout
