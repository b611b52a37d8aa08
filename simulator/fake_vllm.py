"""A fake vLLM 0.32 OpenAI server that can be driven into the states hangwatch must judge.

Real vLLM needs a minute to start and cannot be made to hang on cue in a unit test; this
simulator serves the same endpoints (/metrics, /health, /version, /v1/models,
/v1/completions, /v1/chat/completions) with a /metrics page rebuilt from a real vLLM 0.32
page (see ``simulator_page``), and a small engine whose counters move like vLLM's:

- ``idle``: nothing in flight; a completion runs through the engine and answers.
- ``busy`` (n): n requests decoding; tokens, iterations and KV usage move every step.
- ``saturated`` (waiting): ``max_num_seqs`` running plus a waiting queue.
- ``long_prefill`` (prompt_tokens): one request in a chunked prefill: running 1, token and
  iteration counters flat, KV usage climbing chunk by chunk, prefix_cache_queries jumped by
  the prompt length at the start (as measured on a real vLLM).
- ``frozen`` / ``frozen_idle``: the engine stops (a SIGSTOPped EngineCore): every vllm:*
  sample stays put, /metrics and /health answer, completions block until thawed; a request
  sent during the freeze never shows up as waiting.
- ``asleep`` (level): vllm:engine_sleep_state shows the weights offloaded (1) or discarded (2).
- ``metrics_missing`` / ``metrics_garbage``: /metrics answers 404 / 200 with HTML.
- ``dead``: the listening socket is closed (connection refused); ``revive()`` comes back on
  the same port as a fresh process.
- ``unresponsive``: connections are accepted and never answered (a SIGSTOPped server).

In tests::

    sim = Simulator(manual_clock=True).start()       # port 0: any free loopback port
    sim.set_state("busy", n=3); sim.tick(1.0)        # 20 engine steps
    requests.get(sim.url + "/metrics")
    sim.stop()

As a process: ``python -m hangwatch.simulator --listen 127.0.0.1:8000 --scenario busy-then-hang``;
``POST /_sim/state {"state": "frozen"}`` drives a running one (not a vLLM endpoint).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hangwatch.settings import EXIT_CONFIG, ConfigError, listen_address, secret_file

from . import page as simulator_page
from .quiet import QuietThreadingHTTPServer

VLLM_VERSION = "0.32.0"
CONTENT_TYPE_METRICS = "text/plain; version=1.0.0; charset=utf-8"  # what vLLM 0.32 answers (prometheus_client 0.26)
STATES = ("idle", "busy", "saturated", "long_prefill", "frozen", "frozen_idle", "asleep",
          "metrics_missing", "metrics_garbage", "dead", "unresponsive")
# The instrumentator vLLM configures ignores these handlers.
EXCLUDED_HANDLERS = {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
HTTP_LATENCY_BUCKETS = ["0.1", "0.5", "1.0", "+Inf"]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SCENARIOS = {
    "busy-then-hang": [{"state": "idle", "for": 5}, {"state": "busy", "n": 3, "for": 20},
                       {"state": "frozen"}],
    "long-prefill": [{"state": "long_prefill", "prompt_tokens": 30000}],
    "hang-and-recover": [{"state": "busy", "n": 2, "for": 15}, {"state": "frozen", "for": 30},
                         {"state": "busy", "n": 2, "for": 15}],
    "restart-loop": [{"state": "busy", "n": 2, "for": 20}, {"action": "restart"}],
}


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


class _Hist:
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
class _Request:
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
        self.hists: dict[str, _Hist] = {}
        self.running: list[_Request] = []
        self.waiting: list[_Request] = []
        self.intake: list[_Request] = []       # sent while frozen: never seen by the engine
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
            hist = self.hists[name] = _Hist(self.bounds.get(name, [math.inf]))
        hist.observe(value)

    def gauges(self) -> dict:
        with self.lock:
            return {"vllm:num_requests_running": float(len(self.running)),
                    "vllm:num_requests_waiting": float(len(self.waiting)),
                    "vllm:kv_cache_usage_perc": self.kv_usage}

    # -- requests ----------------------------------------------------------------------
    def submit(self, req: _Request) -> None:
        with self.lock:
            self.seen_request = True
            if self.frozen:
                self.intake.append(req)
            else:
                self._admit(req)

    def _admit(self, req: _Request) -> None:
        self._observe("vllm:request_params_n", req.n)
        self._observe("vllm:request_params_max_tokens", req.max_tokens)
        self._observe("vllm:request_max_num_generation_tokens", req.max_tokens)
        self.waiting.append(req)

    def abort(self, req: _Request) -> None:
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
                req = _Request(self.load.get("prompt_tokens", 30000),
                               self.load.get("max_tokens", 16), now)
            else:
                req = _Request(self.load.get("prompt_tokens", 64),
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

    def _emit_first(self, req: _Request, now: float) -> None:
        req.generated = 1
        req.first_token_at = req.last_token_at = now
        self._inc("vllm:prompt_tokens", req.prompt_tokens)
        self._inc("vllm:prompt_tokens_by_source", req.prompt_tokens, source="local_compute")
        self._inc("vllm:generation_tokens")
        self._observe("vllm:time_to_first_token_seconds", now - req.arrival)

    def _finish(self, req: _Request, reason: str, now: float) -> None:
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


class _Http:
    """What prometheus-fastapi-instrumentator would have recorded."""

    def __init__(self, bounds_highr: list[float]):
        self.lock = threading.Lock()
        self.totals: dict[tuple, float] = {}
        self.created: dict[tuple, float] = {}
        self.in_size: dict[str, list] = {}
        self.out_size: dict[str, list] = {}
        self.lowr: dict[tuple, _Hist] = {}
        self.highr = _Hist(bounds_highr)

    def record(self, method, status, handler, in_size, out_size, seconds, now):
        if handler in EXCLUDED_HANDLERS:
            return
        with self.lock:
            key = (method, f"{str(status)[0]}xx", handler)
            self.totals[key] = self.totals.get(key, 0.0) + 1
            self.created.setdefault(("t",) + key, now)
            self.created.setdefault(("h", handler), now)
            self.created.setdefault(("l", method, handler), now)
            for store, size in ((self.in_size, in_size), (self.out_size, out_size)):
                entry = store.setdefault(handler, [0, 0.0])
                entry[0] += 1
                entry[1] += size
            hist = self.lowr.setdefault((method, handler),
                                        _Hist([float(b) for b in HTTP_LATENCY_BUCKETS]))
            hist.observe(seconds)
            self.highr.observe(seconds)


class _PageSource:
    """Answers simulator_page.render() from one simulator state."""

    def __init__(self, sim: "Simulator"):
        self.sim = sim
        eng = sim.engine
        with eng.lock:
            self.counters = dict(eng.counters)
            self.hists = {k: (h.cumulative(), h.count, h.sum) for k, h in eng.hists.items()}
            self.gauges = eng.gauges()
            self.sleep_level = eng.sleep_level
            self.seen = eng.seen_request
            self.created_at = eng.created
        self.http = sim.http
        self.multiprocess = sim.multiprocess
        self.model = sim.model

    def _labels(self, labels):
        return tuple(sorted((k, v) for k, v in labels.items() if k not in ("model_name", "engine")))

    def rows(self, fam):
        if fam.name.startswith("vllm:") and fam.type == "gauge" and not fam.rows:
            # multiprocess ("mostrecent") gauges have no sample until first set
            if not self.seen:
                return []
            base = {"engine": "0", "model_name": self.model}
            if fam.name == "vllm:num_requests_waiting_by_reason":
                return [{**base, "reason": r} for r in ("capacity", "deferred")]
            return [base]
        if not fam.dynamic:
            return None
        http = self.http
        with http.lock:
            if fam.name == "http_requests":
                return [dict(method=m, status=s, handler=h) for m, s, h in http.totals]  # first seen first
            if fam.name in ("http_request_size_bytes", "http_response_size_bytes"):
                return [dict(handler=h) for h in http.in_size]
            if fam.name == "http_request_duration_seconds":
                if not fam.buckets:
                    fam.buckets = list(HTTP_LATENCY_BUCKETS)
                return [dict(method=m, handler=h) for m, h in http.lowr]
        return []

    def value(self, fam, labels):
        name = fam.name
        if name in self.gauges:
            if self.multiprocess and not self.seen:
                return None
            return self.gauges[name]
        if name == "vllm:num_requests_waiting_by_reason":
            waiting = self.gauges["vllm:num_requests_waiting"]
            return waiting if labels.get("reason") == "capacity" else 0.0
        if name == "vllm:engine_sleep_state":
            state = labels.get("sleep_state")
            level = self.sleep_level
            return float({"awake": level == 0, "weights_offloaded": level == 1,
                          "discard_all": level == 2}.get(state, 0))
        if name.startswith("vllm:"):
            if fam.type == "gauge":
                return 1.0 if name.endswith("_info") else 0.0
            return self.counters.get((name, self._labels(labels)), 0.0)
        if name == "http_requests":
            return self.http.totals.get((labels["method"], labels["status"], labels["handler"]), 0.0)
        return self.sim._process_value(name, labels)

    def hist(self, fam, labels):
        name = fam.name
        if name == "http_request_duration_highr_seconds":
            h = self.http.highr
            return h.cumulative(), h.count, h.sum
        if name in ("http_request_size_bytes", "http_response_size_bytes"):
            store = self.http.in_size if "request" in name else self.http.out_size
            count, total = store.get(labels.get("handler"), [0, 0.0])
            return count, total
        if name == "http_request_duration_seconds":
            h = self.http.lowr.get((labels["method"], labels["handler"]))
            if h is None:
                return [0] * len(fam.buckets), 0, 0.0
            return h.cumulative(), h.count, h.sum
        if name in self.hists:
            return self.hists[name]
        return [0] * len(fam.buckets), 0.0, 0.0

    def created(self, fam, labels):
        name = fam.name
        if name.startswith("http_"):
            c = self.http.created
            if name == "http_requests":
                return c.get(("t", labels["method"], labels["status"], labels["handler"]), self.created_at)
            if name == "http_request_duration_seconds":
                return c.get(("l", labels["method"], labels["handler"]), self.created_at)
            if name in ("http_request_size_bytes", "http_response_size_bytes"):
                return c.get(("h", labels["handler"]), self.created_at)
        return self.created_at


class Simulator:
    """A fake vLLM 0.32 server; thread-safe controls, loopback only."""

    def __init__(self, model: str = "tiny-llama", *, multiprocess: bool = False,
                 manual_clock: bool = False, clock: Clock | None = None,
                 max_num_seqs: int = 8, max_model_len: int = 65536, step_seconds: float = 0.05,
                 prefill_tokens_per_second: float = 6000.0, chunk_tokens: int = 2048,
                 kv_capacity_tokens: int = 65536, host: str = "127.0.0.1", api_key: str | None = None):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the simulator listens on loopback only")
        self.model = model
        self.api_key = api_key  # as vLLM --api-key: every /v1/* call without it answers 401
        self.multiprocess = multiprocess
        self.host = host
        self.clock = clock or Clock(manual=manual_clock)
        self.families = simulator_page.parse_template(simulator_page.template(multiprocess))
        for fam in self.families:
            fam.created = fam.created or (fam.dynamic and not multiprocess)
        self._bounds = {f.name: f.bounds for f in self.families if f.type == "histogram"}
        self._engine_args = dict(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                 step_seconds=step_seconds,
                                 prefill_tokens_per_second=prefill_tokens_per_second,
                                 chunk_tokens=chunk_tokens, kv_capacity_tokens=kv_capacity_tokens)
        self.max_model_len = max_model_len
        self._lock = threading.RLock()
        self._state = "idle"
        self._params: dict = {}
        self._mode = "normal"            # normal, metrics_missing, metrics_garbage, dead, unresponsive
        self._mode_changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._generation = 0             # bumps on restart/kill: in-flight handlers give up
        self._server: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._engine_thread: threading.Thread | None = None
        self._conns: set = set()
        self.port: int | None = None
        self.inference_requests = 0
        self.http_requests = 0
        self._fresh_process()

    # -- lifecycle ---------------------------------------------------------------------
    def _fresh_process(self) -> None:
        now = self.clock.now()
        self.start_time = now - 1.0     # the process starts a little before its engine
        self.engine = Engine(self.clock, self._bounds, **self._engine_args)
        highr = next((f.bounds for f in self.families
                      if f.name == "http_request_duration_highr_seconds"), [math.inf])
        self.http = _Http(highr)
        self.model_created = int(now)
        self.fingerprint = f"vllm-{VLLM_VERSION}-{uuid.uuid4().hex[:8]}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, port: int = 0) -> "Simulator":
        self._open(port)
        if not self.clock.manual:
            self._engine_thread = threading.Thread(target=self._run_engine, daemon=True,
                                                   name="sim-engine")
            self._engine_thread.start()
        return self

    def _open(self, port: int) -> None:
        sim = self

        class Handler(_Handler):
            simulator = sim

        server_cls = _Server6 if ":" in self.host else _Server
        self._server = server_cls((self.host, port), Handler)
        self.port = self._server.server_address[1]
        self._serve_thread = threading.Thread(target=self._server.serve_forever,
                                              kwargs={"poll_interval": 0.05}, daemon=True,
                                              name=f"sim-http-{self.port}")
        self._serve_thread.start()

    def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._generation += 1
            self._mode_changed.notify_all()
        self._close()
        if self._engine_thread is not None:
            self._engine_thread.join(timeout=2)

    def __enter__(self) -> "Simulator":
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run_engine(self) -> None:
        while not self._stopping.is_set():
            self.engine.advance()
            self._stopping.wait(min(0.02, self.engine.step_seconds / 2))

    # -- controls ----------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str, **params) -> None:
        """Drive the simulator into ``state`` (see the module docstring)."""
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; one of {', '.join(STATES)}")
        with self._lock:
            if state == "dead":
                self.kill()
                return
            if self._mode == "dead":
                self.revive()
            self._state, self._params = state, dict(params)
            self._mode = state if state in ("metrics_missing", "metrics_garbage",
                                            "unresponsive") else "normal"
            self._mode_changed.notify_all()
            eng = self.engine
            if state in ("frozen",):
                eng.freeze()
                return
            eng.thaw()
            eng.sleep_level = int(params.get("level", 1)) if state == "asleep" else 0
            if state in ("busy", "saturated", "long_prefill"):
                eng.set_load({"kind": state, **params})
            elif state in ("idle", "frozen_idle", "asleep"):
                eng.set_load({"kind": "idle"})
            if state == "frozen_idle":
                eng.freeze()

    def freeze(self) -> None:
        """Freeze the engine where it is (like kill -STOP of EngineCore)."""
        self.engine.freeze()
        self._state = "frozen"

    def thaw(self) -> None:
        self.engine.thaw()
        if self._state in ("frozen", "frozen_idle"):
            self._state = "busy" if self.engine.load.get("kind") != "idle" else "idle"

    def restart(self) -> None:
        """A new server process: new start time, counters at 0, new _created stamps."""
        with self._lock:
            self._generation += 1
            old = self.engine
            with old.lock:
                for req in old.running + old.waiting + old.intake:
                    req.done.set()
            old_start = self.start_time
            if not self.clock.manual:
                # a new process starts visibly later than the old one (the page shows the
                # start time to 10 ms), even when a test restarts it within milliseconds
                while time.time() - 1.0 <= old_start + 0.02:
                    time.sleep(0.005)
            self._fresh_process()
            self._state, self._params, self._mode = "idle", {}, "normal"
            self._mode_changed.notify_all()

    def kill(self) -> None:
        """Close the listening socket and every connection: connection refused."""
        with self._lock:
            if self._mode == "dead":
                return
            self._mode, self._state = "dead", "dead"
            self._generation += 1
            self._mode_changed.notify_all()
        self._close()

    def revive(self) -> None:
        """Listen again on the same port, as a freshly started process."""
        with self._lock:
            if self._mode != "dead":
                return
            self.restart()
            self._open(self.port)

    def tick(self, seconds: float) -> int:
        """Manual clock: move time on and run the engine steps that fall due."""
        steps = 0
        remaining = seconds
        while remaining > 0:
            delta = min(remaining, 1.0)
            self.clock.advance(delta)
            remaining -= delta
            steps += self.engine.advance()
        return steps

    def wait_for(self, predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())

    @property
    def running(self) -> int:
        return len(self.engine.running)

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    # -- the page ----------------------------------------------------------------------
    def metrics_text(self) -> str:
        return simulator_page.render(self.families, _PageSource(self), self.model,
                                     with_created=not self.multiprocess)

    def _process_value(self, name: str, labels: dict) -> float:
        if name == "process_start_time_seconds":
            return round(self.start_time, 2)
        if name.startswith("python_gc_"):
            stats = gc.get_stats()[int(labels.get("generation", 0))]
            key = {"python_gc_objects_collected": "collected",
                   "python_gc_objects_uncollectable": "uncollectable",
                   "python_gc_collections": "collections"}.get(name)
            return float(stats.get(key, 0))
        if name == "python_info":
            return 1.0
        if name == "process_cpu_seconds":
            t = os.times()
            return t.user + t.system
        if name == "process_open_fds":
            try:
                return float(len(os.listdir("/proc/self/fd")))
            except OSError:
                return 0.0
        if name == "process_max_fds":
            import resource
            return float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        if name in ("process_virtual_memory_bytes", "process_resident_memory_bytes"):
            try:
                with open("/proc/self/statm") as f:
                    vm, rss = f.read().split()[:2]
                page = os.sysconf("SC_PAGE_SIZE")
                return float(int(vm if "virtual" in name else rss) * page)
            except OSError:
                return 0.0
        return 0.0

    # -- request bodies --------------------------------------------------------------------
    def models_json(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.model_created,
            "owned_by": "vllm", "root": self.model, "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                "created": self.model_created, "allow_create_engine": False,
                "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                "group": None, "is_blocking": False}],
        }]}


def _count_tokens(text: str) -> int:
    return max(1, len(text.split())) + 1          # + BOS, like a Llama tokenizer


def _words(n: int) -> str:
    vocab = ("the", "model", "is", "a", "small", "random", "llama", "and", "it", "talks")
    return "".join(" " + vocab[i % len(vocab)] for i in range(n))


def _error(message: str, code: int, kind: str, param=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Server(QuietThreadingHTTPServer):
    allow_reuse_address = True
    request_queue_size = 128


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    simulator: Simulator
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, *args) -> None:       # quiet: tests read pages, not logs
        pass

    def setup(self) -> None:
        super().setup()
        with self.simulator._lock:
            self.simulator._conns.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.simulator._lock:
                self.simulator._conns.discard(self.connection)

    def _hold(self) -> bool:
        """Unresponsive: the connection is accepted, nothing is answered. False: drop it."""
        sim = self.simulator
        with sim._lock:
            generation = sim._generation
            while sim._mode == "unresponsive" and not sim._stopping.is_set():
                sim._mode_changed.wait(0.2)
            if sim._stopping.is_set() or (sim._generation != generation and sim._mode == "dead"):
                self.close_connection = True
                return False
        return True

    def handle_one_request(self) -> None:
        if self._hold():
            super().handle_one_request()

    # -- plumbing ------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, content_type: str = "application/json",
              handler: str | None = None, started: float | None = None) -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        sim = self.simulator
        in_size = int(self.headers.get("Content-Length") or 0)
        elapsed = time.monotonic() - (started or time.monotonic())
        sim.http.record(self.command, code, handler or "none", in_size, len(body), elapsed,
                        time.time())

    def _json(self, code: int, obj, handler: str | None = None, started=None) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json", handler, started)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    def _refused(self, path: str, started: float) -> bool:
        """vLLM --api-key: /v1/* without ``Authorization: Bearer KEY`` is 401 (measured, 0.32)."""
        key = self.simulator.api_key
        if key and path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {key}":
            self._body()
            self._json(401, {"error": "Unauthorized"}, path, started)
            return True
        return False

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:
        sim = self.simulator
        if not self._hold():
            return
        path = self.path.split("?", 1)[0]
        started = time.monotonic()
        if self._refused(path, started):
            return
        if path == "/metrics" or path.startswith("/metrics/"):
            if sim._mode == "metrics_missing":
                return self._json(404, {"detail": "Not Found"}, "/metrics")
            if sim._mode == "metrics_garbage":
                page = b"<html><head><title>502 Bad Gateway</title></head><body>oops</body></html>"
                return self._send(200, page, "text/html; charset=utf-8", "/metrics")
            return self._send(200, sim.metrics_text().encode(), CONTENT_TYPE_METRICS, "/metrics")
        if path in ("/health", "/ping"):
            return self._send(200, b"", "application/json", path)
        if path == "/version":
            return self._json(200, {"version": VLLM_VERSION}, "/version")
        if path == "/v1/models":
            return self._json(200, sim.models_json(), "/v1/models", started)
        if path == "/_sim/state":
            return self._json(200, {"state": sim.state, "params": sim._params,
                                    "inference_requests": sim.inference_requests}, "/_sim/state")
        return self._json(404, {"detail": "Not Found"}, None, started)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        sim = self.simulator
        if not self._hold():
            return
        path = self.path.split("?", 1)[0]
        started = time.monotonic()
        if self._refused(path, started):
            return
        if path == "/_sim/state":
            body = self._body() or {}
            try:
                if body.get("action") == "restart":
                    sim.restart()
                else:
                    sim.set_state(body.pop("state", "idle"), **body)
            except (ValueError, TypeError) as exc:
                return self._json(400, {"error": str(exc)}, "/_sim/state")
            return self._json(200, {"state": sim.state}, "/_sim/state")
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404 if path != "/v1/models" else 405, {"detail": "Not Found"},
                              None, started)
        body = self._body()
        if not isinstance(body, dict):
            return self._json(400, _error("invalid JSON body", 400, "BadRequestError"),
                              path, started)
        with sim._lock:
            sim.inference_requests += 1
        chat = path.endswith("chat/completions")
        if body.get("model") not in (None, sim.model):
            return self._json(404, _error(f"The model `{body.get('model')}` does not exist.",
                                          404, "NotFoundError", "model"), path, started)
        if chat:
            messages = body.get("messages") or []
            prompt_tokens = 8 + sum(_count_tokens(str(m.get("content", ""))) for m in messages)
        else:
            prompt = body.get("prompt", "")
            prompt_tokens = _count_tokens(prompt if isinstance(prompt, str) else " ".join(map(str, prompt)))
        default_max = 16 if not chat else sim.max_model_len - prompt_tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
        if prompt_tokens + int(max_tokens) > sim.max_model_len:
            msg = (f"This model's maximum context length is {sim.max_model_len} tokens. However, "
                   f"you requested {prompt_tokens + int(max_tokens)} tokens "
                   f"({prompt_tokens} in the messages, {max_tokens} in the completion).")
            return self._json(400, _error(msg, 400, "BadRequestError"), path, started)
        generation = sim._generation
        engine = sim.engine
        req = _Request(prompt_tokens, int(max_tokens), sim.clock.now(), synthetic=False)
        engine.submit(req)
        while not req.done.wait(0.05):
            if sim._stopping.is_set() or sim._generation != generation or self._client_gone():
                engine.abort(req)
                self.close_connection = True
                return
        if sim._generation != generation or req.finish_reason is None:
            self.close_connection = True
            return
        self._json(200, self._completion(chat, body, req), path, started)

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _completion(self, chat: bool, body: dict, req: _Request) -> dict:
        sim = self.simulator
        usage = {"prompt_tokens": req.prompt_tokens,
                 "total_tokens": req.prompt_tokens + req.generated,
                 "completion_tokens": req.generated, "prompt_tokens_details": None,
                 "completion_tokens_details": None}
        created = int(time.time())
        text = _words(req.generated)
        if chat:
            choice = {"index": 0, "message": {
                "role": "assistant", "content": text, "refusal": None, "annotations": None,
                "audio": None, "function_call": None, "reasoning": None},
                "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None,
                "token_ids": None, "routed_experts": None}
            return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
                    "created": created, "model": sim.model, "choices": [choice],
                    "service_tier": None, "system_fingerprint": sim.fingerprint,
                    "usage": usage, "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
                    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": req.finish_reason, "stop_reason": None, "token_ids": None,
                  "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        return {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion",
                "created": created, "model": sim.model, "choices": [choice],
                "service_tier": None, "system_fingerprint": sim.fingerprint, "usage": usage,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


# -- the command line ----------------------------------------------------------------------
def load_scenario(spec: str) -> list[dict]:
    """A built-in scenario name, a state name, or a JSON/YAML file of steps:
    ``[{"state": "busy", "n": 3, "for": 10}, {"state": "frozen"}, {"action": "restart"}]``."""
    if spec in SCENARIOS:
        return [dict(step) for step in SCENARIOS[spec]]
    if spec in STATES:
        return [{"state": spec}]
    with open(spec, encoding="utf-8") as f:
        text = f.read()
    try:
        steps = json.loads(text)
    except ValueError:
        import yaml
        steps = yaml.safe_load(text)
    if isinstance(steps, dict):
        steps = steps.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ValueError(f"{spec}: a scenario is a list of steps")
    return steps


def run_scenario(sim: Simulator, steps: list[dict], stop: threading.Event,
                 loop: bool = False) -> None:
    while True:
        for step in steps:
            step = dict(step)
            seconds = step.pop("for", None)
            if step.pop("action", None) == "restart":
                sim.restart()
            else:
                sim.set_state(step.pop("state", "idle"), **step)
            if seconds is None:
                return
            if stop.wait(float(seconds)):
                return
        if not loop:
            return


def _parse_listen(value: str) -> tuple[str, int]:
    try:
        host, port = listen_address(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise argparse.ArgumentTypeError("the simulator listens on loopback only")
    return host, port


def check_steps(steps: list[dict], spec: str) -> None:
    """Every step names a known state or action, and ``for`` is seconds: a typo fails at start-up,
    not in the scenario's thread minutes later."""
    for number, step in enumerate(steps):
        action, state, seconds = step.get("action"), step.get("state", "idle"), step.get("for")
        if action not in (None, "restart"):
            raise ConfigError(f"{spec}: step {number}: unknown action {action!r} (known: restart)")
        if action is None and state not in STATES:
            raise ConfigError(f"{spec}: step {number}: unknown state {state!r} (known: {', '.join(STATES)})")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 <= seconds < math.inf):
            raise ConfigError(f"{spec}: step {number}: for: {seconds!r} is not a number of seconds")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad usage: one line and exit 64, as every hangwatch command
        sys.stderr.write(f"hangwatch simulate: {message} (see --help)\n")
        raise SystemExit(EXIT_CONFIG)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m hangwatch.simulator",
                     description="A fake vLLM 0.32 server for tests and demos.")
    parser.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 8000),
                        help="loopback HOST:PORT (default 127.0.0.1:8000)")
    parser.add_argument("--model", default="tiny-llama", help="served model name")
    parser.add_argument("--multiprocess", action="store_true",
                        help="page as with --api-server-count > 1 (no process_/python_/_created)")
    parser.add_argument("--scenario", help=f"a state, a built-in ({', '.join(SCENARIOS)}) "
                                           "or a JSON/YAML file of steps")
    parser.add_argument("--loop", action="store_true", help="repeat the scenario")
    parser.add_argument("--api-key-file", help="as vLLM --api-key: /v1/* answers 401 without this key")
    args = parser.parse_args(argv)
    host, port = args.listen
    import yaml
    try:
        steps = load_scenario(args.scenario) if args.scenario else []
        check_steps(steps, args.scenario)
        api_key = secret_file(args.api_key_file, "--api-key-file") if args.api_key_file else None
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ConfigError is a ValueError
        if isinstance(exc, OSError):
            reason = f"cannot read {exc.filename}: {exc.strerror}"
        elif isinstance(exc, yaml.YAMLError):
            reason = f"--scenario: {args.scenario} is neither JSON nor YAML: {' '.join(str(exc).split())}"
        else:
            reason = exc
        sys.stderr.write(f"hangwatch simulate: {reason}\n")
        return EXIT_CONFIG
    sim = Simulator(args.model, multiprocess=args.multiprocess, host=host, api_key=api_key).start(port)
    stop = threading.Event()

    def _stop(*_):
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"simulator: vLLM {VLLM_VERSION} model={args.model} listening on {sim.url}",
          flush=True)
    if steps:
        threading.Thread(target=run_scenario, args=(sim, steps, stop, args.loop),
                         daemon=True).start()
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
