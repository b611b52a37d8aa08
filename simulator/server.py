"""The fake vLLM server: its lifecycle (start, stop, restart, kill, revive) and the controls tests drive.

Tests and demos need a server they can put into any state hangwatch judges and read like a real
one; this ties the engine model, the page and the HTTP handler together behind ``Simulator``.

In tests::

    sim = Simulator(manual_clock=True).start()       # port 0: any free loopback port
    sim.set_state("busy", n=3); sim.tick(1.0)        # 20 engine steps
    requests.get(sim.url + "/metrics")
    sim.stop()
"""
from __future__ import annotations

import math
import socket
import threading
import time
import uuid
from http.server import ThreadingHTTPServer

from . import page as simulator_page
from .engine import VLLM_VERSION, Clock, Engine
from .handler import ControlHandler, Handler, Server, Server6
from .page_source import HttpStats, PageSource

# idle: nothing in flight, a completion runs through the engine. busy (n): n requests decoding.
# saturated (waiting): max_num_seqs running plus a queue. long_prefill (prompt_tokens): one chunked
# prefill, token and iteration counters flat, KV usage climbing. frozen / frozen_idle: the engine stops
# (a SIGSTOPped EngineCore), /metrics and /health still answer, completions block until thawed.
# asleep (level): weights offloaded (1) or discarded (2). metrics_missing / metrics_garbage: /metrics
# answers 404 / HTML. dead: connection refused until revive(). unresponsive: accepted, never answered.
STATES = ("idle", "busy", "saturated", "long_prefill", "frozen", "frozen_idle", "asleep",
          "metrics_missing", "metrics_garbage", "dead", "unresponsive")


class Simulator:
    """A fake vLLM 0.32 server with thread-safe controls; it listens where it is told (loopback by default)."""

    def __init__(self, model: str = "tiny-llama", *, multiprocess: bool = False,
                 manual_clock: bool = False, clock: Clock | None = None,
                 max_num_seqs: int = 8, max_model_len: int = 65536, step_seconds: float = 0.05,
                 prefill_tokens_per_second: float = 6000.0, chunk_tokens: int = 2048,
                 kv_capacity_tokens: int = 65536, host: str = "127.0.0.1", api_key: str | None = None):
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
        self._control: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._engine_thread: threading.Thread | None = None
        self._conns: set = set()
        self.port: int | None = None
        self.control_host, self.control_port = host, None
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
        self.http = HttpStats(highr)
        self.model_created = int(now)
        self.fingerprint = f"vllm-{VLLM_VERSION}-{uuid.uuid4().hex[:8]}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def control_url(self) -> str:
        """Where ``/_sim/state`` answers in every state, ``dead`` included (``start(control_port=)``);
        without a control port, the server's own URL (which a dead server does not answer)."""
        if self.control_port is None:
            return self.url
        host = f"[{self.control_host}]" if ":" in self.control_host else self.control_host
        return f"http://{host}:{self.control_port}"

    def start(self, port: int = 0, control_port: int | None = None, control_host: str | None = None) -> "Simulator":
        """Listen on ``port`` (0: any free port); with ``control_port`` (0: any), serve the
        controls there too (on ``control_host``, default the server's host), apart from the simulated server."""
        self._open(port)
        if control_port is not None:
            self._open_control(control_host or self.host, control_port)
        if not self.clock.manual:
            self._engine_thread = threading.Thread(target=self._run_engine, daemon=True,
                                                   name="sim-engine")
            self._engine_thread.start()
        return self

    def _open(self, port: int) -> None:
        sim = self

        class BoundHandler(Handler):
            simulator = sim

        server_cls = Server6 if ":" in self.host else Server
        self._server = server_cls((self.host, port), BoundHandler)
        self.port = self._server.server_address[1]
        self._serve_thread = threading.Thread(target=self._server.serve_forever,
                                              kwargs={"poll_interval": 0.05}, daemon=True,
                                              name=f"sim-http-{self.port}")
        self._serve_thread.start()

    def _open_control(self, host: str, port: int) -> None:
        sim = self

        class BoundControl(ControlHandler):
            simulator = sim

        self._control = (Server6 if ":" in host else Server)((host, port), BoundControl)
        self.control_host, self.control_port = host, self._control.server_address[1]
        threading.Thread(target=self._control.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"sim-control-{self.control_port}").start()

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
        control, self._control = self._control, None
        if control is not None:
            control.shutdown()
            control.server_close()
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
        """Drive the simulator into ``state`` (see ``STATES``)."""
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
        source = PageSource(self.engine, self.http, model=self.model, multiprocess=self.multiprocess,
                            start_time=self.start_time)
        return simulator_page.render(self.families, source, self.model, with_created=not self.multiprocess)


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

