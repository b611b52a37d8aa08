"""Where the stacks wait → a named cause, with the evidence it rests on. One table, one place.

A dump of every thread of every process is long; what an engineer needs first is the one
place that explains the hang. Each row looks for one known way an LLM server wedges, in
order (the most specific first); the first that matches names the incident, and its
evidence says which process, thread and frame it saw. Add a row here for a new cause (and a
captured py-spy output under tests/data/forensics/ to prove it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator

COLLECTIVE = re.compile(r"all_reduce|all_gather\w*|reduce_scatter\w*|barrier|broadcast\w*|all_to_all\w*")
CUDA_SYNC = re.compile(r"(?:cuda|cu)(?:Stream|Device|Event|Ctx)Synchroni[sz]e\w*")
TOKENIZER_FILES = ("tokenizers/", "tokenization_utils", "detokenizer", "/tokenizer")


@dataclass(frozen=True)
class Signature:
    name: str
    cause: str
    evidence: list[str]


@dataclass(frozen=True)
class Row:
    name: str
    cause: str
    find: Callable[[list[dict]], list[str]]   # processes -> evidence lines (empty: no match)


def threads(processes: list[dict]) -> Iterator[tuple[dict, dict]]:
    for process in processes:
        for thread in process.get("threads") or ():
            yield process, thread


def short(name: str) -> str:
    """``EngineCore.step`` -> ``step``; a native ``ncclAllReduce`` stays itself."""
    return name.rsplit(".", 1)[-1]


def is_stdlib(frame: dict) -> bool:
    path = frame.get("file") or ""
    return path.startswith("<") or ("/lib/python3" in path and "-packages/" not in path) or path in ("None", "")


def where(frame: dict) -> str:
    path = frame.get("file") or "?"
    return f"{frame.get('name')} ({path.rsplit('/', 1)[-1]}:{frame.get('line')})"


def own_frame(thread: dict) -> dict | None:
    """The innermost frame that is not the standard library's (a wait's caller, not the wait)."""
    frames = thread.get("frames") or []
    return next((f for f in frames if not is_stdlib(f)), frames[0] if frames else None)


def main_thread(process: dict) -> dict | None:
    """The thread whose OS id is the process id (py-spy lists threads in no fixed order)."""
    listed = process.get("threads") or []
    return next((t for t in listed if t.get("os_thread_id") == process.get("pid")), listed[0] if listed else None)


def about(process: dict, thread: dict, frame: dict | None) -> str:
    spot = where(frame) if frame else "no Python frame"
    return f"pid {process['pid']} ({process.get('name')}) thread {thread.get('name')}: {spot}"


def _matching(processes: list[dict], test: Callable[[dict, dict], bool]) -> list[str]:
    evidence = []
    for process, thread in threads(processes):
        frame = next((f for f in thread.get("frames") or () if test(f, thread)), None)
        if frame is not None:
            evidence.append(about(process, thread, frame) + (f" under {where(own_frame(thread))}"
                                                             if own_frame(thread) is not frame else ""))
    return evidence


def _stopped(processes: list[dict]) -> list[str]:
    evidence = []
    for process in processes:
        if process.get("state") in ("T", "t"):
            main = main_thread(process)
            last = f"; its last stack: {where(own_frame(main))}" if main and own_frame(main) else ""
            evidence.append(f"pid {process['pid']} ({process.get('name')}) is stopped (state {process['state']}: "
                            f"SIGSTOP, a debugger or a job-control stop){last}")
    return evidence


def _collective(frame: dict, thread: dict) -> bool:
    name, path = frame.get("name") or "", frame.get("file") or ""
    if "nccl" in name.lower() and not is_stdlib(frame):
        return True
    return bool(COLLECTIVE.fullmatch(short(name))) and "distributed" in path and "shm_broadcast" not in path


def _cuda_sync(frame: dict, thread: dict) -> bool:
    name, path = frame.get("name") or "", frame.get("file") or ""
    return bool(CUDA_SYNC.search(name)) or (short(name) == "synchronize" and "cuda" in path)


def _shm_dequeue(frame: dict, thread: dict) -> bool:
    """vLLM's shared-memory MessageQueue, read while waiting for a reply (EngineCore waiting on a
    worker) — not a worker's idle wait for its next task (``worker_busy_loop``)."""
    if not (frame.get("file") or "").endswith("shm_broadcast.py") or short(frame.get("name") or "") not in (
            "dequeue", "acquire_read"):
        return False
    return not any(short(f.get("name") or "") == "worker_busy_loop" for f in thread.get("frames") or ())


def _tokenizer(frame: dict, thread: dict) -> bool:
    path = frame.get("file") or ""
    return any(part in path for part in TOKENIZER_FILES)


def _engine_step(frame: dict, thread: dict) -> bool:
    path, name = frame.get("file") or "", short(frame.get("name") or "")
    return path.endswith("v1/engine/core.py") and "step" in name


def _gil_holder(frame: dict, thread: dict) -> bool:
    return bool(thread.get("owns_gil")) and bool(thread.get("active")) and frame is own_frame(thread)


def _unknown(processes: list[dict]) -> list[str]:
    evidence = []
    for process in processes:
        main = main_thread(process)
        if main is not None:
            evidence.append(about(process, main, own_frame(main)))
    return evidence or ["no stacks were read (see errors)"]


SIGNATURES: tuple[Row, ...] = (
    Row("process_stopped", "a process of the server is stopped (state T): nothing in it runs until SIGCONT",
        _stopped),
    Row("nccl_collective", "waiting in a collective (NCCL all-reduce / all-gather / barrier): another rank "
        "never joined", lambda ps: _matching(ps, _collective)),
    Row("cuda_synchronize", "waiting for the GPU (CUDA synchronize): a kernel that never finishes, or a "
        "faulted device", lambda ps: _matching(ps, _cuda_sync)),
    Row("vllm_shm_broadcast_dequeue", "vLLM's EngineCore waits in the shared-memory broadcast queue for a "
        "worker's reply: a worker is stuck or gone", lambda ps: _matching(ps, _shm_dequeue)),
    Row("tokenizer", "inside the tokenizer / detokenizer", lambda ps: _matching(ps, _tokenizer)),
    Row("engine_step_stuck", "vLLM's EngineCore never returns from an engine step (the innermost frame says "
        "where)", lambda ps: _matching(ps, _engine_step)),
    Row("gil_holder", "one thread holds the GIL and runs: every other Python thread of that process waits "
        "for it", lambda ps: _matching(ps, _gil_holder)),
    Row("unknown", "no known pattern: read the stacks", _unknown),
)
NAMES = tuple(row.name for row in SIGNATURES)


def classify(processes: list[dict]) -> Signature:
    """The first row of ``SIGNATURES`` that matches; ``unknown`` (with each main thread's place) otherwise."""
    for row in SIGNATURES:
        evidence = row.find(processes)
        if evidence:
            return Signature(row.name, row.cause, evidence[:10])
    return Signature("unknown", SIGNATURES[-1].cause, [])
