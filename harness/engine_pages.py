"""SGLang and TGI /metrics pages built from those engines' documented metric definitions.

Neither engine can run on these machines, so the engine-table tests and the engine benchmark
need their pages as documents: SGLang's as its collector declares them through prometheus_client
(``python/sglang/srt/metrics/collector.py``), TGI's router as ``metrics-exporter-prometheus``
renders its ``metrics`` crate names (no ``_total`` suffix, series absent until first set).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


def sglang_page(*, running=4, queued=2, passes=1000, prompt=5000, gen=20000, finished=40, usage=0.31,
                ranks=(0,), with_passes=True) -> str:
    """An SGLang /metrics page, declared as SGLang's collector declares it.

    Scheduler gauges (``multiprocess_mode="mostrecent"``) carry the scheduler labels, one
    label set per data-parallel rank; tokenizer counters carry ``model_name``. Values are
    split evenly over the ranks.
    """
    registry = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
    running_g = Gauge("sglang:num_running_reqs", "The number of running requests.", labels, registry=registry)
    queue_g = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels,
                    registry=registry)
    usage_g = Gauge("sglang:token_usage", "The token usage.", labels, registry=registry)
    throughput = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", labels, registry=registry)
    passes_c = Counter("sglang:cuda_graph_passes", "Total number of forward passes categorized by CUDA graph.",
                       labels + ["mode"], registry=registry) if with_passes else None
    for rank in ranks:
        values = ["tiny-llama", "unified", "0", "0", str(rank)]
        running_g.labels(*values).set(running / len(ranks))
        queue_g.labels(*values).set(queued / len(ranks))
        usage_g.labels(*values).set(usage)
        throughput.labels(*values).set(123.4)
        if passes_c is not None:
            passes_c.labels(*values, "decode_none").inc(passes / len(ranks))
    tokenizer = ["model_name"]
    Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", tokenizer,
            registry=registry).labels("tiny-llama").inc(prompt)
    Counter("sglang:generation_tokens", "Number of generation tokens processed.", tokenizer,
            registry=registry).labels("tiny-llama").inc(gen)
    Counter("sglang:num_requests", "Number of requests processed.", tokenizer,
            registry=registry).labels("tiny-llama").inc(finished)
    Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              tokenizer, registry=registry).labels("tiny-llama").observe(0.3)
    return generate_latest(registry).decode()


def tgi_page(*, batch=4, queue=2, prefill=10, decode=900, success=30, generated=4500, fresh=False) -> str:
    """A TGI router page as ``metrics-exporter-prometheus`` renders it.

    ``fresh``: no request has reached the queue yet, so the queue and batch gauges (and the
    inference counters) have never been set and are absent: the crate registers on first use.
    """
    lines = ["# TYPE tgi_request_count counter", f"tgi_request_count {success + queue + batch}", ""]
    if not fresh:
        lines += [
            "# TYPE tgi_batch_inference_count counter",
            f'tgi_batch_inference_count{{method="prefill"}} {prefill}',
            f'tgi_batch_inference_count{{method="decode"}} {decode}',
            "",
            "# TYPE tgi_batch_inference_success counter",
            f'tgi_batch_inference_success{{method="prefill"}} {prefill}',
            f'tgi_batch_inference_success{{method="decode"}} {decode}',
            "",
            "# TYPE tgi_request_success counter",
            f"tgi_request_success {success}",
            "",
            "# TYPE tgi_queue_size gauge",
            f"tgi_queue_size {queue}",
            "",
            "# TYPE tgi_batch_current_size gauge",
            f"tgi_batch_current_size {batch}",
            "",
            "# TYPE tgi_batch_current_max_tokens gauge",
            f"tgi_batch_current_max_tokens {batch * 1024}",
            "",
            "# TYPE tgi_request_generated_tokens histogram",
            'tgi_request_generated_tokens_bucket{le="1"} 0',
            'tgi_request_generated_tokens_bucket{le="+Inf"} ' + str(success),
            f"tgi_request_generated_tokens_sum {generated}",
            f"tgi_request_generated_tokens_count {success}",
            "",
        ]
    lines += ["# TYPE tgi_request_input_length histogram",
              'tgi_request_input_length_bucket{le="+Inf"} 3', "tgi_request_input_length_sum 300",
              "tgi_request_input_length_count 3", ""]
    return "\n".join(lines) + "\n"
