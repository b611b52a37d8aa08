"""Start, load, freeze and stop a real llama-server for the real-llama.cpp test tier.

The binary and the random-weight model come from ``.ci/setup-llamacpp.sh``
(``${HANGWATCH_CACHE:-/var/cache/hangwatch}/llama.cpp/current``, or ``HANGWATCH_LLAMACPP_DIR``).
The server listens on 127.0.0.1 only and is stopped by PID (thawed first); it also dies
with the test process (PR_SET_PDEATHSIG), so a killed pytest leaves nothing behind.

Load goes through llama.cpp's native ``POST /completion``; hangwatch's idle probe uses
``POST /v1/completions``. Every request, ours or the probe, becomes one slot task, which the
server logs as ``processing task``: counting those lines (and ``tokens_predicted_total``)
proves from llama.cpp's own side whether a probe was sent.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import requests

MODEL_FILE = "hangwatch-1024x12-f16.gguf"
SLOTS = 4
CONTEXT = 4096
BATCH = 4096  # -b and -ub: one 3,900-token prompt is ONE llama_decode() call (REAL-PARTS)


def llamacpp_dir() -> str:
    if os.environ.get("HANGWATCH_LLAMACPP_DIR"):
        return os.environ["HANGWATCH_LLAMACPP_DIR"]
    cache = os.environ.get("HANGWATCH_CACHE", "/var/cache/hangwatch")
    return os.path.join(cache, "llama.cpp", "current")


def server_binary() -> str:
    return os.path.join(llamacpp_dir(), "src", "build", "bin", "llama-server")


def model_path() -> str:
    return os.path.join(llamacpp_dir(), "models", MODEL_FILE)


def installed() -> bool:
    return os.access(server_binary(), os.X_OK) and os.path.isfile(model_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def metric(text: str, name: str) -> float | None:
    """One unlabelled sample from a llama.cpp page (independent of hangwatch's parser)."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


@dataclass
class Load:
    """Requests running in threads; ``results`` fills as they finish."""

    threads: list[threading.Thread] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def wait(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))
        alive = sum(t.is_alive() for t in self.threads)
        assert not alive, f"{alive} requests still running after {deadline_s} s"


class LlamaServer:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.logdir = tempfile.mkdtemp(prefix="hangwatch-llamacpp-")
        self.log_path = os.path.join(self.logdir, "server.log")
        self.frozen = False

    # --- life cycle ----------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        args = [server_binary(), "-m", model_path(), "--metrics", "--host", "127.0.0.1",
                "--port", str(self.port), "-np", str(SLOTS), "-c", str(CONTEXT),
                # unified KV: any one slot may hold a ~3,900-token prompt; one batch for it
                "--kv-unified", "-b", str(BATCH), "-ub", str(BATCH), "--no-webui"]
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not healthy within {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.thaw()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if not os.environ.get("HANGWATCH_KEEP_LOGS"):
            shutil.rmtree(self.logdir, ignore_errors=True)

    def freeze(self) -> None:
        """kill -STOP: every thread stops; connections are accepted and never answered."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False

    # --- reading ---------------------------------------------------------------------------

    def metrics_text(self, timeout: float = 5.0) -> str:
        answer = requests.get(self.url + "/metrics", timeout=timeout)
        answer.raise_for_status()
        return answer.text

    def value(self, name: str) -> float | None:
        return metric(self.metrics_text(), name)

    def slots(self) -> list[dict] | None:
        answer = requests.get(self.url + "/slots", timeout=5)
        return answer.json() if answer.status_code == 200 else None

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def tasks_launched(self) -> int:
        """Slot tasks the server started (one per request: ours and any probe)."""
        return self.log_text().count("processing task")

    def wait_until(self, predicate, deadline_s: float, what: str, interval: float = 0.1) -> str:
        """Poll /metrics until ``predicate(text)``; return that page."""
        end = time.monotonic() + deadline_s
        text = ""
        while time.monotonic() < end:
            try:
                text = self.metrics_text()
                if predicate(text):
                    return text
            except requests.RequestException:
                pass
            time.sleep(interval)
        raise AssertionError(f"timed out after {deadline_s} s waiting for {what}; last page:\n{text}")

    def wait_idle(self, deadline_s: float = 120) -> str:
        return self.wait_until(lambda t: metric(t, "llamacpp:requests_processing") == 0
                               and metric(t, "llamacpp:requests_deferred") == 0, deadline_s, "idle")

    # --- load ------------------------------------------------------------------------------

    def completions(self, n: int, *, n_predict: int, prompt: str = "Once upon a time",
                    timeout: float = 600) -> Load:
        """``n`` concurrent native /completion requests (exactly ``n_predict`` tokens each)."""
        load = Load()

        def run():
            body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": False,
                    "temperature": 0}
            try:
                answer = requests.post(self.url + "/completion", json=body, timeout=timeout)
                answer.raise_for_status()
                load.results.append(answer.json())
            except requests.RequestException as exc:  # noqa: PERF203
                load.errors.append(str(exc))

        for _ in range(n):
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            load.threads.append(thread)
        return load

    def prompt_of(self, n_tokens: int) -> str:
        """A prompt that tokenizes to about ``n_tokens`` tokens (measured with /tokenize)."""
        unit = " the quick brown fox jumps over the lazy dog"

        def tokens(text: str) -> int:
            answer = requests.post(self.url + "/tokenize", json={"content": text}, timeout=30)
            return len(answer.json()["tokens"])

        units = max(1, n_tokens // tokens(unit))
        for _ in range(3):  # the tokenizer merges across repeats: correct by the measured ratio
            count = tokens(unit * units)
            if abs(count - n_tokens) <= n_tokens * 0.01:
                break
            units = max(1, int(units * n_tokens / count))
        text = unit * units
        count = tokens(text)
        assert abs(count - n_tokens) <= n_tokens * 0.02, (count, n_tokens)
        return text
