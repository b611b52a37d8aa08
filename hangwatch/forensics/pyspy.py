"""One ``py-spy dump`` of one process, cut at a deadline, its failure explained.

py-spy reads the Python stacks of another process from outside it (process_vm_readv), which is
what a hung server needs: nothing inside the server has to answer. ``--nonblocking`` reads
without pausing the server; ``--native`` (C/C++ frames) needs the process paused, so it is
asked only when chosen. A py-spy that never returns is killed (its whole process group) when
the deadline comes; every failure becomes one sentence naming the likely cause.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field

NAME = "py-spy"


@dataclass
class Dump:
    threads: list[dict] = field(default_factory=list)
    error: str | None = None


def find_py_spy(explicit: str | None = None) -> str | None:
    """The py-spy to run: the one given, else the one beside this Python (the ``forensics``
    extra installs it there), else the first on PATH."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    beside = os.path.join(os.path.dirname(sys.executable), NAME)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which(NAME)


def ptrace_scope() -> str | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def why_failed(stderr: str, pid: int) -> str:
    """py-spy's own words, preceded by what they most likely mean here."""
    text = " ".join(stderr.split())[-400:] or "no output"
    lower = text.lower()
    if "permission denied" in lower or "operation not permitted" in lower or "os error 1)" in lower:
        scope = ptrace_scope()
        where = f"kernel.yama.ptrace_scope={scope}" if scope is not None else "no Yama ptrace_scope on this kernel"
        return (f"pid {pid}: no permission to read its memory (needs CAP_SYS_PTRACE, or the same user with "
                f"kernel.yama.ptrace_scope=0; {where}): {text}")
    if "no such process" in lower or "os error 3)" in lower:
        return f"pid {pid}: the process is gone (or in another PID namespace): {text}"
    if "python" in lower and ("version" in lower or "interpreter" in lower):
        return f"pid {pid}: not a Python process (or its interpreter could not be found): {text}"
    return f"pid {pid}: py-spy failed: {text}"


def start(py_spy: str, pid: int, *, native: bool, with_locals: bool) -> subprocess.Popen:
    argv = [py_spy, "dump", "--json", "--pid", str(pid)]
    argv.append("--native" if native else "--nonblocking")
    if with_locals:
        argv.append("--locals")
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def finish(child: subprocess.Popen, pid: int, seconds_left: float) -> Dump:
    """Wait at most ``seconds_left`` for a started dump; kill it (and its group) past that."""
    try:
        out, err = child.communicate(timeout=max(0.0, seconds_left))
    except subprocess.TimeoutExpired:
        kill(child)
        return Dump(error=f"pid {pid}: py-spy did not finish before the capture's deadline; killed")
    if child.returncode != 0:
        return Dump(error=why_failed(err.decode("utf-8", "replace"), pid))
    try:
        threads = json.loads(out)
    except ValueError:
        return Dump(error=f"pid {pid}: py-spy's output is not JSON: {out[:200]!r}")
    if not isinstance(threads, list):
        return Dump(error=f"pid {pid}: py-spy's output is not a list of threads")
    return Dump(threads=[t for t in threads if isinstance(t, dict)])


def kill(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        child.kill()
    except OSError:
        pass
    try:
        child.communicate(timeout=2.0)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
