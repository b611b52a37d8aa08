"""The one table that maps each engine's metric names to hangwatch's normalized reading.

Every engine names the same few facts differently, and each lies in its own way about
progress. Keeping the mapping in one place means adding an engine is a table row, and the
parser, the verdict and the docs all read the same truth.

Field meanings (all summed over every label set, e.g. vLLM's ``engine`` and ``model_name``):

- ``running`` / ``waiting``: requests being processed / queued. Their sum is "in flight".
- ``steps``: a counter that moves once per engine iteration (the engine's heartbeat).
- ``prompt_tokens`` / ``generation_tokens``: token counters. Beware: in vLLM 0.32 they do
  not move during a long chunked prefill; in llama.cpp ``tokens_predicted`` moves only when
  a request finishes.
- ``prefix_cache_queries``: moves when a prefill is scheduled (vLLM: jumps by the prompt
  length at the start of a prefill).
- ``finished``: requests completed by the engine.
- ``kv_cache_usage``: a 0..1 gauge; climbs chunk by chunk during a long prefill.
- ``process_start``: seconds since the epoch; absent in vLLM's multiprocess mode.

Counter names are listed without ``_total``: the parser accepts both spellings.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineMetrics:
    """How one engine exposes the normalized fields on its /metrics page."""

    name: str
    marker: str  # a substring only this engine's page contains
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    counters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gauges: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # A gauge whose labelled samples say the engine is asleep: (family, label, awake value)
    sleep_state: tuple[str, str, str] | None = None
    # Label carrying the served model's name, if any.
    model_label: str | None = None
    # Families whose "declared but no sample yet" means zero (multiprocess start-up).
    process_start: tuple[str, ...] = ("process_start_time_seconds",)
    # Normalized fields whose movement between two readings proves engine work.
    progress: tuple[str, ...] = ()
    # Series a scrape must never rely on, and why (documentation; the parser ignores them).
    unreliable: dict[str, str] = field(default_factory=dict)
    # A cheap endpoint answering {"version": "..."} (never touches the engine), if any.
    version_path: str | None = None


VLLM = EngineMetrics(
    name="vllm",
    marker="vllm:",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    counters={
        "steps": ("vllm:iteration_tokens_total_count",),
        "prompt_tokens": ("vllm:prompt_tokens",),
        "generation_tokens": ("vllm:generation_tokens",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "finished": ("vllm:request_success",),
    },
    gauges={"kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
    sleep_state=("vllm:engine_sleep_state", "sleep_state", "awake"),
    model_label="model_name",
    progress=(
        "steps",
        "prompt_tokens",
        "generation_tokens",
        "prefix_cache_queries",
        "finished",
        "kv_cache_usage",
    ),
    version_path="/version",
    unreliable={
        "vllm:prompt_tokens_total": "flat during a whole chunked prefill (measured, vLLM 0.32)",
        "vllm:iteration_tokens_total": "flat during a whole chunked prefill (measured, vLLM 0.32)",
    },
)

LLAMACPP = EngineMetrics(
    name="llamacpp",
    marker="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    counters={
        "steps": ("llamacpp:n_decode",),
        "prompt_tokens": ("llamacpp:prompt_tokens",),
        "generation_tokens": ("llamacpp:tokens_predicted",),
    },
    gauges={"kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",)},
    progress=("steps", "prompt_tokens", "generation_tokens", "kv_cache_usage"),
    unreliable={
        "llamacpp:prompt_tokens_seconds": "reset by every read of /metrics",
        "llamacpp:predicted_tokens_seconds": "reset by every read of /metrics",
        "llamacpp:tokens_predicted_total": "moves only when a request finishes",
        "llamacpp:n_decode_total": "steps once per batch during a long prompt, seconds apart",
    },
)

SGLANG = EngineMetrics(
    name="sglang",
    marker="sglang:",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    counters={
        "prompt_tokens": ("sglang:prompt_tokens",),
        "generation_tokens": ("sglang:generation_tokens",),
        "finished": ("sglang:num_requests",),
    },
    gauges={"kv_cache_usage": ("sglang:token_usage",)},
    model_label="model_name",
    progress=("prompt_tokens", "generation_tokens", "finished", "kv_cache_usage"),
)

TGI = EngineMetrics(
    name="tgi",
    marker="tgi_queue_size",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    counters={
        "steps": ("tgi_batch_inference_count",),
        "finished": ("tgi_request_success",),
    },
    progress=("steps", "finished"),
)

# A FastChat model worker has no /metrics page: exporter/fastchat.py reads its JSON
# /worker_get_status (queue_length = running + waiting). It has no progress counter at all,
# so a worker with work queued is "busy, unverified" and never hung on that basis. It is not
# in ENGINES: no page is ever detected as FastChat, and no page is parsed as one.
FASTCHAT = EngineMetrics(
    name="fastchat",
    marker="",
    running=(),
    waiting=(),
    process_start=(),
    progress=(),
)

ENGINES: tuple[EngineMetrics, ...] = (VLLM, LLAMACPP, SGLANG, TGI)
ENGINES_BY_NAME = {engine.name: engine for engine in (*ENGINES, FASTCHAT)}

# The normalized counter fields (a Reading has one attribute per name).
COUNTER_FIELDS = ("steps", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "finished")
GAUGE_FIELDS = ("kv_cache_usage",)


def detect_engine(page: str) -> EngineMetrics | None:
    """The engine whose marker appears on the page, or None: an unknown page is never guessed."""
    for engine in ENGINES:
        if engine.marker in page:
            return engine
    return None
