"""What the soak measures over time: vLLM's own counters sampled, CPU per process, windows.

How it measures: bench/README.md.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass

import requests

from harness.vllm_server import parse_prometheus

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    at: float                 # time.monotonic()
    running: float
    waiting: float
    generation_tokens: float  # vllm:generation_tokens_total
    prompt_tokens: float      # vllm:prompt_tokens_total
    inference_requests: float  # http_requests_total of /v1/completions + /v1/chat/completions
    seconds: float            # how long the page took


def read_sample(url: str, timeout: float = 10) -> Sample:
    started = time.monotonic()
    page = parse_prometheus(requests.get(url + "/metrics", timeout=timeout).text)
    took = time.monotonic() - started
    return Sample(started, page.value("vllm:num_requests_running") or 0,
                  page.value("vllm:num_requests_waiting") or 0,
                  page.value("vllm:generation_tokens_total") or 0,
                  page.value("vllm:prompt_tokens_total") or 0,
                  inference_requests(page), took)


def inference_requests(page) -> float:
    """Inference requests vLLM has answered (its http_requests_total, any status)."""
    return sum(v for (name, labels), v in page.samples.items() if name == "http_requests_total"
               and dict(labels).get("handler") in ("/v1/completions", "/v1/chat/completions"))


class Sampler:
    def __init__(self, url: str, every_s: float = 2.0):
        self.url, self.every_s = url, every_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-sampler")

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.every_s
            try:
                sample = read_sample(self.url)
            except (requests.RequestException, ValueError):
                self.errors += 1
                continue
            with self._lock:
                self.samples.append(sample)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if start <= s.at < end]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    finished: int
    succeeded: int
    latency_p50: float | None
    generation_tps: float | None   # vLLM's generated tokens per second in the window
    prompt_tps: float | None
    saturated_share: float | None  # samples with a request waiting or every slot running

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.finished if self.finished else None


def _at(samples: list, t: float):
    """The last sample at or before ``t`` (None if none)."""
    before = [s for s in samples if s.at <= t]
    return before[-1] if before else None


def windows(requests_: list, samples: list, start: float, end: float, width: float,
            slots: int | None = None) -> list[Window]:
    """Equal windows of ``width`` seconds over [start, end); requests by the time they ended.
    A sample is saturated when a request waits or all ``slots`` (``--max-num-seqs``) run."""
    out = []
    n = max(1, int((end - start) // width))
    for i in range(n):
        a, b = start + i * width, start + (i + 1) * width
        done = [r for r in requests_ if a <= r.ended_at < b]
        ok = [r for r in done if r.ok]
        latencies = sorted(r.ended_at - r.sent_at for r in ok)
        first, last = _at(samples, a), _at(samples, b)
        inside = [s for s in samples if a <= s.at < b]
        gen = prompt = None
        if first is not None and last is not None and last.at > first.at:
            gen = (last.generation_tokens - first.generation_tokens) / (last.at - first.at)
            prompt = (last.prompt_tokens - first.prompt_tokens) / (last.at - first.at)
        saturated = (sum(1 for s in inside if s.waiting > 0 or (slots and s.running >= slots)) / len(inside)
                     if inside else None)
        out.append(Window(a, b, len(done), len(ok), statistics.median(latencies) if latencies else None,
                          gen, prompt, saturated))
    return out


@dataclass(frozen=True)
class Spread:
    mean: float
    sd: float
    low: float
    high: float
    n: int

    def show(self, fmt: str = "{:.1f}", scale: float = 1.0) -> str:
        f = lambda v: fmt.format(v * scale)  # noqa: E731
        return f"{f(self.mean)} ± {f(self.sd)} ({f(self.low)}–{f(self.high)}, n={self.n})"


def spread(values) -> Spread | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return Spread(statistics.fmean(values), sd, min(values), max(values), len(values))
