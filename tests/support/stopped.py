"""SIGSTOP a process and return once it has stopped: every thread of it in state T.

``kill(pid, SIGSTOP)`` returns before the process has stopped: each thread stops on its own as
the kernel gets to it. A test that judges "frozen" right after the signal could have its first
request answered by a thread still running; it waits for this first (as ``VLLMServer.freeze``
and the FastChat fleet's ``Server.freeze`` do for their processes).
"""
from __future__ import annotations

import os
import signal

from hangwatch.demo.wait import wait_until


def thread_states(pid: int) -> list[str]:
    """The state letter of every thread of ``pid`` (empty: the process is gone)."""
    states = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return states
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    return states


def stop(pid: int, what: str, deadline: float = 5.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        states = thread_states(pid)
        return bool(states) and all(state in ("T", "t") for state in states)
    wait_until(stopped, deadline, f"{what} (pid {pid}) stopped", interval=0.02)
