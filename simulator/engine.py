"""The simulated vLLM engine: a scheduler and steps whose counters move as a real EngineCore's do.

A test must be able to drive a server into busy, long prefill, frozen or asleep on cue and with a
manual clock; this is the part that decides what moves and when, apart from how it is served.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

VLLM_VERSION = "0.32.0"


class Clock:
    """Real time by default; ``manual=True`` moves only when ``advance()`` is called."""

    def __init__(self, manual: bool = False, start: float | None = None):
        self.manual = manual
        self._now = time.time() if start is None else start

    def now(self) -> float:
        return self._now if self.manual else time.time()

    def advance(self, seconds: float) -> None:
        if not self.manual:
            raise RuntimeError("advance() needs a manual clock")
        self._now += seconds


class Histogram:
    def __init__(self, bounds: list[float]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        out, running = [], 0
        for c in self.counts:
            running += c
            out.append(running)
        return out


@dataclass
class Request:
    prompt_tokens: int
    max_tokens: int
    arrival: float
    synthetic: bool = True
    n: int = 1
    prefilled: int = 0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Engine:
    """The simulated EngineCore: scheduler, steps and the stats vLLM would export."""

    def __init__(self, clock: Clock, bounds: dict[str, list[float]], *, max_num_seqs: int,
                 max_model_len: int, step_seconds: float, prefill_tokens_per_second: float,
                 chunk_tokens: int, kv_capacity_tokens: int, block_size: int = 16):
        self.clock = clock
        self.bounds = bounds
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.step_seconds = step_seconds
        self.prefill_tps = prefill_tokens_per_second
        self.chunk_tokens = chunk_tokens
        self.kv_capacity = kv_capacity_tokens
        self.block_size = block_size
        self.lock = threading.RLock()
        self.created = clock.now()
        self.counters: dict[tuple, float] = {}
        self.hists: dict[str, Histogram] = {}
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.intake: list[Request] = []       # sent while frozen: never seen by the engine
        self.frozen = False
        self.sleep_level = 0
        self.seen_request = False
        self.load: dict = {"kind": "idle"}
        self.next_step_at = clock.now() + step_seconds
        self.kv_usage = 0.0

    # -- stats -------------------------------------------------------------------------
    def _inc(self, name: str, amount: float = 1.0, **labels) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + amount

    def _observe(self, name: str, value: float) -> None:
        hist = self.hists.get(name)
        if hist is None:
            hist = self.hists[name] = Histogram(self.bounds.get(name, [math.inf]))
        hist.observe(value)

    def gauges(self) -> dict:
        with self.lock:
            return {"vllm:num_requests_running": float(len(self.running)),
                    "vllm:num_requests_waiting": float(len(self.waiting)),
                    "vllm:kv_cache_usage_perc": self.kv_usage}

    # -- requests ----------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        with self.lock:
            self.seen_request = True
            if self.frozen:
                self.intake.append(req)
            else:
                self._admit(req)

    def _admit(self, req: Request) -> None:
        self._observe("vllm:request_params_n", req.n)
        self._observe("vllm:request_params_max_tokens", req.max_tokens)
        self._observe("vllm:request_max_num_generation_tokens", req.max_tokens)
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        with self.lock:
            if req in self.intake:
                self.intake.remove(req)
            elif not self.frozen and (req in self.waiting or req in self.running):
                self._finish(req, "abort", self.clock.now())

    def set_load(self, load: dict) -> None:
        with self.lock:
            self.load = load
            for req in list(self.waiting) + list(self.running):
                if req.synthetic:
                    (self.waiting if req in self.waiting else self.running).remove(req)
            self._top_up(self.clock.now())
            self._schedule(self.clock.now())
            self._update_kv()

    def _top_up(self, now: float) -> None:
        kind = self.load["kind"]
        synthetic = sum(r.synthetic for r in self.running + self.waiting)
        if kind == "busy":
            want = self.load.get("n", 3)
        elif kind == "saturated":
            want = self.max_num_seqs + self.load.get("waiting", 4)
        elif kind == "long_prefill":
            want = 0 if self.load.get("started") else 1
            self.load["started"] = True
        else:
            want = 0
        for _ in range(max(0, want - synthetic)):
            if kind == "long_prefill":
                req = Request(self.load.get("prompt_tokens", 30000),
                               self.load.get("max_tokens", 16), now)
            else:
                req = Request(self.load.get("prompt_tokens", 64),
                               self.load.get("max_tokens", 256), now)
            self.seen_request = True
            self._admit(req)

    def _schedule(self, now: float) -> None:
        if self.sleep_level:
            return
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting.pop(0)
            req.scheduled_at = now
            self._inc("vllm:prefix_cache_queries", req.prompt_tokens)
            self.running.append(req)

    def _update_kv(self) -> None:
        blocks = sum(math.ceil((r.prefilled + r.generated) / self.block_size) for r in self.running)
        self.kv_usage = min(1.0, blocks * self.block_size / self.kv_capacity)

    # -- time --------------------------------------------------------------------------
    def freeze(self) -> None:
        with self.lock:
            self.frozen = True

    def thaw(self) -> None:
        with self.lock:
            if not self.frozen:
                return
            self.frozen = False
            now = self.clock.now()
            self.next_step_at = now + self.step_seconds
            for req in self.intake:
                self._admit(req)
            self.intake.clear()

    def advance(self, now: float | None = None, max_steps: int = 100000) -> int:
        """Run every engine step due by ``now``; returns how many ran."""
        with self.lock:
            now = self.clock.now() if now is None else now
            if self.frozen or self.sleep_level:
                self.next_step_at = max(self.next_step_at, now)
                return 0
            steps = 0
            while self.next_step_at <= now and steps < max_steps:
                self.next_step_at += self._step(self.next_step_at)
                steps += 1
            if steps == max_steps:
                self.next_step_at = now + self.step_seconds
            return steps

    def _step(self, now: float) -> float:
        """One engine step at time ``now``; returns its duration."""
        self._top_up(now)
        self._schedule(now)
        scheduled = 0
        emitted = 0
        prefill_tokens = 0
        for req in list(self.running):
            if req.prefilled < req.prompt_tokens:
                chunk = min(self.chunk_tokens - prefill_tokens, req.prompt_tokens - req.prefilled)
                if chunk <= 0:
                    continue
                req.prefilled += chunk
                prefill_tokens += chunk
                scheduled += chunk
                if req.prefilled < req.prompt_tokens:
                    continue                  # chunked prefill: no output, nothing counted
                self._emit_first(req, now)
                emitted += 1
            else:
                scheduled += 1
                req.generated += 1
                self._inc("vllm:generation_tokens")
                self._observe("vllm:inter_token_latency_seconds", now - (req.last_token_at or now))
                req.last_token_at = now
                emitted += 1
            if req.generated >= req.max_tokens:
                self._finish(req, "length", now)
        if emitted:
            self._observe("vllm:iteration_tokens_total", scheduled)
        self._update_kv()
        self._top_up(now)
        return self.step_seconds + prefill_tokens / self.prefill_tps

    def _emit_first(self, req: Request, now: float) -> None:
        req.generated = 1
        req.first_token_at = req.last_token_at = now
        self._inc("vllm:prompt_tokens", req.prompt_tokens)
        self._inc("vllm:prompt_tokens_by_source", req.prompt_tokens, source="local_compute")
        self._inc("vllm:generation_tokens")
        self._observe("vllm:time_to_first_token_seconds", now - req.arrival)

    def _finish(self, req: Request, reason: str, now: float) -> None:
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        req.finished_at = now
        req.finish_reason = reason
        self._inc("vllm:request_success", finished_reason=reason)
        start = req.scheduled_at if req.scheduled_at is not None else now
        first = req.first_token_at if req.first_token_at is not None else now
        self._observe("vllm:e2e_request_latency_seconds", now - req.arrival)
        self._observe("vllm:request_queue_time_seconds", start - req.arrival)
        self._observe("vllm:request_inference_time_seconds", now - start)
        self._observe("vllm:request_prefill_time_seconds", first - start)
        self._observe("vllm:request_decode_time_seconds", now - first)
        self._observe("vllm:request_prompt_tokens", req.prompt_tokens)
        self._observe("vllm:request_generation_tokens", req.generated)
        self._observe("vllm:request_prefill_kv_computed_tokens", req.prompt_tokens)
        self._observe("vllm:request_num_preemptions", 0)
        if req.generated > 1:
            self._observe("vllm:request_time_per_output_token_seconds",
                          (now - first) / (req.generated - 1))
        req.done.set()

