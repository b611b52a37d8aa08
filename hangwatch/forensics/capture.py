"""The capture: every process of the server behind a URL, its state and Python stacks, within one deadline.

This is what an engineer asks first after a hang — where was each process stuck? — taken
before the restart wipes it. It never raises and never outlives its deadline: py-spy runs on
every process at once, nvidia-smi beside them, and whatever has not answered when the deadline
comes is killed and recorded as cut. Secrets stay out: command lines lose the values of
key/token flags, locals are read only when asked (and then secret-named ones are blanked), and
the strings given as ``secrets`` (the target's API key) are scrubbed from everything.
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Iterable

from ..install import extra_command
from ..printable import printable
from ..scrub import REDACTED, scrub, secret_named
from . import pyspy
from .pins import Pin
from .processes import find_server
from .signatures import classify

DEADLINE = 10.0  # seconds for the whole capture, by default
MAX_PROCESSES = 64   # processes read per capture; the rest counted as not read
MAX_CONCURRENT = 4   # py-spy at once
NVIDIA_SMI = "nvidia-smi"
__all__ = ["DEADLINE", "capture", "render", "scrub"]


def capture(url: str, *, deadline: float = DEADLINE, native: bool = False, with_locals: bool = False,
            secrets: Iterable[str] = (), py_spy: str | None = None, proc: str = "/proc",
            clock: Callable[[], float] = time.monotonic, pin: Pin | None = None, container: str | None = None,
            container_trusted: bool = False,
            max_processes: int = MAX_PROCESSES, max_concurrent: int = MAX_CONCURRENT,
            max_output_bytes: int = pyspy.MAX_OUTPUT_BYTES) -> dict:
    """The stacks of the server's processes (``processes.find_server``: ``pin`` or the URL, ``container``
    narrowing) and the signature they match (see ``signatures``). At most ``max_processes`` read, at
    most ``max_concurrent`` py-spy at once, each output at most ``max_output_bytes``; ``errors`` says
    what could not be read and why; the call returns by ``deadline`` seconds, nothing left running."""
    started = clock()
    ends = started + deadline
    captured_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    errors: list[str] = []
    found = _discover(url, proc, ends - clock(), errors, pin=pin, container=container,
                      container_trusted=container_trusted, limit=max_processes)
    processes: list[dict] = []
    not_read = 0
    if found is not None:
        errors += found.errors
        not_read = found.not_read
        if not_read:
            errors.append(f"{not_read} more processes not read (forensics.max_processes is {max_processes})")
        processes = [{"pid": p.pid, "ppid": p.ppid, "name": p.name, "state": p.state, "cmdline": list(p.cmdline),
                      "netns": p.netns, "threads": []} for p in found.processes]
    tool = pyspy.find_py_spy(py_spy)
    if processes and tool is None:
        errors.append(f"py-spy not found (install it: {extra_command('forensics')}; or give its path): no stacks, "
                      "process states only")
    gpu = _start_nvidia_smi()
    cut = False
    if tool is not None and processes:
        dumps = _dump_all(tool, processes, native=native, with_locals=with_locals, max_concurrent=max_concurrent,
                          max_output_bytes=max_output_bytes, ends=started + deadline, clock=clock)
        for process, dump in zip(processes, dumps):
            if dump.error:
                cut = cut or "deadline" in dump.error
                errors.append(dump.error)
                process["error"] = dump.error
            process["threads"] = [_thread(t, with_locals) for t in dump.threads]
    gpu_text = _finish_nvidia_smi(gpu, ends - clock(), errors)
    result = {
        "signature": None, "captured_at": captured_at, "url": url,
        "processes": processes, "errors": errors, "not_read": not_read,
        "netns": sorted({p["netns"] for p in processes if p.get("netns")}),
        "pinned": pin.describe() if pin is not None else None,
        "gpu": gpu_text, "deadline": deadline, "cut_at_deadline": cut,
        "native": native, "locals": with_locals, "py_spy": tool,
    }
    signature = classify(processes)
    result |= {"signature": signature.name, "cause": signature.cause, "evidence": signature.evidence}
    result["seconds"] = round(clock() - started, 3)
    return scrub(result, [s for s in secrets if s])


def _dump_all(tool: str, processes: list[dict], *, native: bool, with_locals: bool, max_concurrent: int,
              max_output_bytes: int, ends: float, clock: Callable[[], float]) -> list[pyspy.Dump]:
    """One py-spy per process, at most ``max_concurrent`` at once, all ended by ``ends``."""
    dumps: list[pyspy.Dump | None] = [None] * len(processes)
    ends_monotonic = time.monotonic() + max(0.0, ends - clock())
    queue = list(range(len(processes)))
    mutex = threading.Lock()

    def worker():
        while True:
            with mutex:
                if not queue:
                    return
                index = queue.pop(0)
            pid = processes[index]["pid"]
            if time.monotonic() >= ends_monotonic:
                dumps[index] = pyspy.Dump(error=f"pid {pid}: not read: the capture's deadline came first")
                continue
            dumps[index] = pyspy.run(tool, pid, native=native, with_locals=with_locals, ends=ends_monotonic,
                                     max_output_bytes=max_output_bytes)
    workers = [threading.Thread(target=worker, name="hangwatch-forensics-py-spy", daemon=True)
               for _ in range(max(1, min(max_concurrent, len(processes))))]
    for thread in workers:
        thread.start()
    for thread in workers:  # each run kills its py-spy at the deadline: these end just after it
        thread.join(max(0.0, ends_monotonic - time.monotonic()) + 5.0)
    return [d or pyspy.Dump(error=f"pid {p['pid']}: not read before the capture's deadline")
            for p, d in zip(processes, dumps)]


def _discover(url: str, proc: str, seconds_left: float, errors: list[str], **how):
    """``find_server`` within the deadline too (a host name to resolve, a huge /proc)."""
    box: dict = {}

    def run():
        try:
            box["found"] = find_server(url, proc, **how)
        except Exception as exc:  # noqa: BLE001 - a capture explains, never raises
            box["error"] = f"process discovery failed: {type(exc).__name__}: {exc}"
    worker = threading.Thread(target=run, name="hangwatch-forensics-discovery", daemon=True)
    worker.start()
    worker.join(max(0.0, seconds_left))
    if worker.is_alive():
        errors.append("process discovery did not finish before the capture's deadline")
        return None
    if "error" in box:
        errors.append(box["error"])
    return box.get("found")


def _thread(raw: dict, with_locals: bool) -> dict:
    frames = []
    for frame in raw.get("frames") or ():
        if not isinstance(frame, dict):
            continue
        shown = {"name": str(frame.get("name")), "file": str(frame.get("filename")), "line": frame.get("line")}
        if with_locals and frame.get("locals"):
            shown["locals"] = [_local(v) for v in frame["locals"] if isinstance(v, dict)]
        frames.append(shown)
    return {"name": str(raw.get("thread_name") or raw.get("thread_id")), "os_thread_id": raw.get("os_thread_id"),
            "active": bool(raw.get("active")), "owns_gil": bool(raw.get("owns_gil")), "frames": frames}


def _local(variable: dict) -> dict:
    name = str(variable.get("name"))
    value = variable.get("repr")
    if secret_named(name):
        value = REDACTED
    return {"name": name, "repr": None if value is None else str(value)[:500]}


def _start_nvidia_smi() -> subprocess.Popen | None:
    tool = shutil.which(NVIDIA_SMI)
    if tool is None:
        return None
    try:
        return subprocess.Popen([tool], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError:
        return None


def _finish_nvidia_smi(child: subprocess.Popen | None, seconds_left: float, errors: list[str]) -> str | None:
    if child is None:
        return None
    try:
        out, _ = child.communicate(timeout=max(0.0, seconds_left))
    except subprocess.TimeoutExpired:
        pyspy.kill(child)
        errors.append("nvidia-smi did not finish before the capture's deadline; killed (a wedged GPU driver?)")
        return None
    return out.decode("utf-8", "replace")[-20000:]


def render(answer: dict) -> str:
    """A capture for a person: the signature and its evidence first, then every stack."""
    from hangwatch.incidents import stacks
    lines = [f"{answer.get('verdict')}: {answer.get('reason')}",
             f"signature: {answer.get('signature')}: {answer.get('cause')}"]
    lines += [f"  evidence: {line}" for line in answer.get("evidence") or ()]
    lines += [f"  error: {line}" for line in answer.get("errors") or ()]
    lines.append(f"captured at {answer.get('captured_at')} in {answer.get('seconds')} s "
                 f"(deadline {answer.get('deadline')} s)")
    return "\n".join([printable(line) for line in lines] + stacks(answer))  # a frame name never drives a terminal
