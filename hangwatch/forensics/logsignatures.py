"""What the server said before it hung → a named cause, its class and what to do. One table.

A restart helps a wedged engine; it does not help a GPU with an Xid, and it reloads the weights
for nothing three times before a person hears. The server often says which it is in its own
log, so each row here is one line a real server writes (with the report it came from), the
signature it names, its class and the default policy: ``restart`` or ``alert_only``. The first
row that matches any recent line wins (rows are ordered: hardware before what a faulted GPU
also makes the engine say). A target may override the policy per class (webhook config
``targets[].policy``). ``docs/signatures.md`` is generated from this table
(``python -m hangwatch.forensics.signatures_doc``).

The stack signatures (``signatures.py``) have a class too (``STACK_CLASSES``); when both match,
the log row's class wins: the server's own words are more specific than where its threads wait.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

CLASSES = ("engine_wedge", "collective_timeout", "hardware", "memory", "startup", "unknown")
POLICIES = ("restart", "alert_only")
MAX_SCANNED = 2000       # characters of one line looked at (a line can be a whole traceback)


@dataclass(frozen=True)
class LogRow:
    name: str            # the signature
    pattern: str         # a regular expression searched in each log line
    klass: str           # one of CLASSES
    policy: str          # the default: restart | alert_only
    source: str          # the report the line came from
    server: str          # who writes it
    example: str         # a line as the server writes it (docs/signatures.md; the tests print it)

    @property
    def regex(self) -> re.Pattern:
        return _compiled(self.pattern)


@dataclass(frozen=True)
class LogMatch:
    name: str
    klass: str
    policy: str
    line: str            # the log line that matched (cut to MAX_SCANNED)
    source: str

    def as_dict(self) -> dict:
        return {"name": self.name, "class": self.klass, "policy": self.policy, "line": self.line,
                "source": self.source}


LOG_SIGNATURES: tuple[LogRow, ...] = (
    # Hardware first: a faulted card also makes the engine time out and die.
    LogRow("gpu_xid", r"\bNVRM: Xid\b|\bXid \(PCI:[^)]*\): \d+", "hardware", "alert_only",
           "vllm-backport#62 (Xid 48/63/94: the hang came back after every restart)", "kernel / driver",
           "NVRM: Xid (PCI:0000:3b:00): 48, pid=2117, name=python3, An uncorrectable double bit error (DBE) has been detected"),
    LogRow("gpu_uncorrectable_ecc", r"uncorrectable ECC error", "hardware", "alert_only",
           "vllm-backport#62 (remapped HBM rows)", "CUDA",
           "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    LogRow("cuda_illegal_memory_access", r"an illegal memory access was encountered", "hardware", "alert_only",
           "vllm#40926 (CUDA error in a worker; restarts do not heal a faulted device)", "CUDA",
           "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"),
    LogRow("nccl_watchdog_timeout", r"Watchdog caught collective operation timeout", "collective_timeout",
           "restart", "vllm#41530 (NCCL: a rank never joined the collective)", "NCCL / torch.distributed",
           "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4121, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600048 milliseconds before timing out."),
    LogRow("vllm_rpc_sample_tokens_timeout", r"RPC call to sample_tokens timed out", "collective_timeout",
           "restart", "vllm#41530, vllm#40926 (TP collectives; then EngineDeadError)", "vLLM",
           "TimeoutError: RPC call to sample_tokens timed out."),
    LogRow("vllm_shm_broadcast_stalled", r"No available shared memory broadcast block found", "engine_wedge",
           "restart", "vllm#51921 (every 60 s while the engine is stalled)", "vLLM",
           "(EngineCore_DP0 pid=311) INFO 12-05 07:07:08 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 second."),
    LogRow("vllm_engine_core_fatal", r"EngineCore encountered a fatal error", "engine_wedge", "restart",
           "vllm#40926 (the engine core died; the API server stays up)", "vLLM",
           "(EngineCore_DP0 pid=311) ERROR 12-05 07:07:08 [core.py:843] EngineCore encountered a fatal error."),
    LogRow("vllm_engine_dead", r"\bEngineDeadError\b", "engine_wedge", "restart",
           "vllm#41530 (raised after the engine core died)", "vLLM",
           "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."),
    LogRow("sglang_detokenizer_unresponsive",
           r"Health check failed\. Server couldn't get a response from detokenizer", "engine_wedge", "restart",
           "sglang health check (the detokenizer process stopped answering)", "SGLang",
           "[2026-12-05 07:07:08] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds."),
    LogRow("sglang_kv_pool_leak", r"token_to_kv_pool_allocator memory leak detected", "memory", "restart",
           "sglang scheduler self-check (KV-cache pages leaked)", "SGLang",
           "ValueError: token_to_kv_pool_allocator memory leak detected! available_size=812, max_total_num_tokens=1024"),
    LogRow("pd_prefill_not_ready", r"Timeout waiting for P side ready", "startup", "restart",
           "P/D disaggregation (the decode side waits for a prefill peer)", "vLLM / SGLang P/D",
           "(EngineCore_DP0 pid=311) ERROR 12-05 07:07:08 Timeout waiting for P side ready after 300 seconds"),
)
NAMES = tuple(row.name for row in LOG_SIGNATURES)

# The stack signatures' classes (signatures.py names → class); the policy of a stack-only
# signature is restart (what hangwatch did before it read logs). A name the capture sent that is
# not in the stack table is ``invalid`` (a capture is an exporter's answer, not trusted text).
STACK_CLASSES = {
    "process_stopped": "engine_wedge",
    "nccl_collective": "collective_timeout",
    "cuda_synchronize": "engine_wedge",
    "vllm_shm_broadcast_dequeue": "engine_wedge",
    "tokenizer": "engine_wedge",
    "engine_step_stuck": "engine_wedge",
    "gil_holder": "engine_wedge",
    "unknown": "unknown",
}


_CACHE: dict[str, re.Pattern] = {}


def _compiled(pattern: str) -> re.Pattern:
    if pattern not in _CACHE:
        _CACHE[pattern] = re.compile(pattern)
    return _CACHE[pattern]


def match(lines: Iterable[str]) -> LogMatch | None:
    """The first row (table order) that matches any of ``lines``, with the newest line it matched."""
    lines = [line[:MAX_SCANNED] for line in lines]
    for row in LOG_SIGNATURES:
        for line in reversed(lines):
            if row.regex.search(line):
                return LogMatch(row.name, row.klass, row.policy, line, row.source)
    return None


def stack_class(signature: str | None) -> str:
    """The class of a stack signature; ``invalid`` for a name the stack table does not have."""
    if signature is None:
        return "unknown"
    return STACK_CLASSES.get(signature, "invalid")
