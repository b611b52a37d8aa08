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
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

NAME = "py-spy"
MAX_OUTPUT_BYTES = 4 * 1024 * 1024  # one dump's JSON; more is cut and the dump refused
MAX_STDERR_BYTES = 64 * 1024


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


def run(py_spy: str, pid: int, *, native: bool, with_locals: bool, ends: float,
        max_output_bytes: int = MAX_OUTPUT_BYTES) -> Dump:
    """One dump, read with a byte cap against the capture's one deadline (``ends``, monotonic);
    past either, py-spy's whole process group is killed: nothing is left running."""
    try:
        child = start(py_spy, pid, native=native, with_locals=with_locals)
    except OSError as exc:
        return Dump(error=f"pid {pid}: cannot run py-spy {py_spy}: {exc.strerror or exc}")
    out, err, problem = bytearray(), bytearray(), None
    caps = {child.stdout: (out, max_output_bytes), child.stderr: (err, MAX_STDERR_BYTES)}
    with selectors.DefaultSelector() as selector:
        for stream in caps:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and problem is None:
            left = ends - time.monotonic()
            if left <= 0:
                problem = f"pid {pid}: py-spy did not finish before the capture's deadline; killed"
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                kept, cap = caps[key.fileobj]
                kept += chunk
                if len(kept) > cap and key.fileobj is child.stdout:
                    problem = f"pid {pid}: py-spy wrote more than {cap} bytes (max_output_bytes); cut and killed"
                    break
                del kept[cap:]
    if problem is not None:
        kill(child)
        return Dump(error=problem)
    try:
        child.wait(max(0.0, ends - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill(child)
        return Dump(error=f"pid {pid}: py-spy did not finish before the capture's deadline; killed")
    finally:
        for stream in caps:
            stream.close()
    return _parsed(child.returncode, bytes(out), bytes(err), pid)


def _parsed(code: int, out: bytes, err: bytes, pid: int) -> Dump:
    if code != 0:
        return Dump(error=why_failed(err.decode("utf-8", "replace"), pid))
    try:
        threads = json.loads(out)
    except ValueError:
        return Dump(error=f"pid {pid}: py-spy's output is not JSON: {out[:200]!r}")
    if not isinstance(threads, list):
        return Dump(error=f"pid {pid}: py-spy's output is not a list of threads")
    return Dump(threads=[t for t in threads if isinstance(t, dict)])


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
