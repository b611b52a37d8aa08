"""Keep one core busy while the real tiers run, to shake out races before CI does.

The real tiers time real servers on two cores. A wait that can be satisfied before the evidence
its assertion reads exists passes on an idle machine and fails on a loaded one (Prometheus
starting late, a rule evaluation slipping by a step). ``pytest --cpu-hog`` (or
``HANGWATCH_CPU_HOG=1 bash .ci/run``) starts one spinning process per requested core for the
whole session, at normal priority so it competes with the servers under test, and stops it by
PID at the end. CI does not run it; authors run it locally before pushing a change to a wait.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

ENV = "HANGWATCH_CPU_HOG"
SPIN = "while True: pass"


def requested(option: int | None) -> int:
    """Cores to keep busy: ``--cpu-hog`` (one), else ``HANGWATCH_CPU_HOG`` (``1`` = one core), else 0."""
    if option:
        return option
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0
    try:
        cores = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a number of cores to keep busy (1 keeps one busy)") from None
    return max(cores, 0)


class CpuHog:
    """``cores`` busy-looping Python processes, started together and stopped by PID."""

    def __init__(self, cores: int):
        self.cores = cores
        self.processes: list[subprocess.Popen] = []

    def start(self) -> "CpuHog":
        for _ in range(self.cores):
            self.processes.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                                   start_new_session=True))
        return self

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.processes.clear()
