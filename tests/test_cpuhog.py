"""The CPU hog that `--cpu-hog` / HANGWATCH_CPU_HOG start beside the real tiers (harness/cpuhog.py):
it really keeps a core busy, and nothing of it outlives stop()."""
from __future__ import annotations

import os
import time

import pytest

from harness.cpuhog import ENV, CpuHog, requested


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_hog_spins_and_stops(monkeypatch):
    hog = CpuHog(1).start()
    try:
        [process] = hog.processes
        deadline = time.monotonic() + 20
        while cpu_seconds(process.pid) < 0.3:
            assert time.monotonic() < deadline, "the hog used no CPU"
            time.sleep(0.05)
    finally:
        hog.stop()
    assert process.poll() is not None and not hog.processes


def test_the_option_and_the_variable(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert requested(None) == 0
    assert requested(1) == 1
    monkeypatch.setenv(ENV, "2")
    assert requested(None) == 2
    monkeypatch.setenv(ENV, "many")
    with pytest.raises(ValueError, match="HANGWATCH_CPU_HOG"):
        requested(None)
