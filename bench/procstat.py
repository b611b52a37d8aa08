"""CPU seconds, memory and threads of a process, from /proc (Linux), for the benchmarks."""
from __future__ import annotations

import os
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    cpu: float       # user + system seconds since the process started
    system: float    # of which system (kernel) seconds
    rss: int         # bytes resident now
    peak_rss: int    # bytes, the high-water mark
    threads: int
    fds: int


def sample(pid: int) -> ProcSample:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK   # utime, stime (fields 14, 15)
    status = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            status[key] = value.split()
    kb = 1024
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = -1
    return ProcSample(cpu, int(fields[12]) / _TICK, int(status["VmRSS"][0]) * kb, int(status["VmHWM"][0]) * kb,
                      int(status["Threads"][0]), fds)


def loadavg() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])
