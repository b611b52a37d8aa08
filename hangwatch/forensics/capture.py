"""The capture: every process of the server behind a URL, its state and Python stacks, within one deadline.

This is what an engineer asks first after a hang — where was each process stuck? — taken
before the restart wipes it. It never raises and never outlives its deadline: py-spy runs on
every process at once, nvidia-smi beside them, and whatever has not answered when the deadline
comes is killed and recorded as cut. Secrets stay out: command lines lose the values of
key/token flags, locals are read only when asked (and then secret-named ones are blanked), and
the strings given as ``secrets`` (the target's API key) are scrubbed from everything.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Iterable

from ..install import extra_command
from . import pyspy
from .processes import REDACTED, SECRET_FLAGS, find_server
from .signatures import classify

DEADLINE = 10.0  # seconds for the whole capture, by default
NVIDIA_SMI = "nvidia-smi"
TOKEN_SHAPES = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\b(sk-|hf_|ghp_|xox[bap]-)[A-Za-z0-9_-]{12,}")


def capture(url: str, *, deadline: float = DEADLINE, native: bool = False, with_locals: bool = False,
            secrets: Iterable[str] = (), py_spy: str | None = None, proc: str = "/proc",
            clock: Callable[[], float] = time.monotonic) -> dict:
    """The stacks of every process serving ``url`` and the signature they match (see ``signatures``).
    ``errors`` says what could not be read and why; the call returns by ``deadline`` seconds."""
    started = clock()
    ends = started + deadline
    captured_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    errors: list[str] = []
    found = _discover(url, proc, ends - clock(), errors)
    processes: list[dict] = []
    if found is not None:
        errors += found.errors
        processes = [{"pid": p.pid, "ppid": p.ppid, "name": p.name, "state": p.state, "cmdline": list(p.cmdline),
                      "threads": []} for p in found.processes]
    tool = pyspy.find_py_spy(py_spy)
    if processes and tool is None:
        errors.append(f"py-spy not found (install it: {extra_command('forensics')}; or give its path): no stacks, "
                      "process states only")
    gpu = _start_nvidia_smi()
    dumps = []
    if tool is not None:
        for process in processes:
            try:
                dumps.append((process, pyspy.start(tool, process["pid"], native=native, with_locals=with_locals)))
            except OSError as exc:
                errors.append(f"pid {process['pid']}: cannot run py-spy {tool}: {exc.strerror or exc}")
    cut = False
    for process, child in dumps:
        dump = pyspy.finish(child, process["pid"], ends - clock())
        if dump.error:
            cut = cut or "deadline" in dump.error
            errors.append(dump.error)
            process["error"] = dump.error
        process["threads"] = [_thread(t, with_locals) for t in dump.threads]
    gpu_text = _finish_nvidia_smi(gpu, ends - clock(), errors)
    result = {
        "signature": None, "captured_at": captured_at, "url": url,
        "processes": processes, "errors": errors,
        "gpu": gpu_text, "deadline": deadline, "cut_at_deadline": cut,
        "native": native, "locals": with_locals, "py_spy": tool,
    }
    signature = classify(processes)
    result |= {"signature": signature.name, "cause": signature.cause, "evidence": signature.evidence}
    result["seconds"] = round(clock() - started, 3)
    return scrub(result, [s for s in secrets if s])


def _discover(url: str, proc: str, seconds_left: float, errors: list[str]):
    """``find_server`` within the deadline too (a host name to resolve, a huge /proc)."""
    box: dict = {}

    def run():
        try:
            box["found"] = find_server(url, proc)
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
    if any(word in name.lower() for word in SECRET_FLAGS):
        value = REDACTED
    return {"name": name, "repr": None if value is None else str(value)[:500]}


def scrub(value, secrets: list[str]):
    """Every string in ``value`` without the given secrets and without anything shaped like a token."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return TOKEN_SHAPES.sub(lambda m: (m.group(1) or m.group(2) or "") + REDACTED, value)
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    return value


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
    return "\n".join(lines + stacks(answer))
