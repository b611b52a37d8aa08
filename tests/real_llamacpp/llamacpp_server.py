"""Start, load, freeze and stop a real llama-server for the real-llama.cpp test tier.

The binary and the random-weight model come from ``.ci/setup-llamacpp.sh``
(``${HANGWATCH_CACHE:-/var/cache/hangwatch}/llama.cpp/current``, or ``HANGWATCH_LLAMACPP_DIR``).
The server binds port 0 on 127.0.0.1 (the port is read back) and is stopped by PID (thawed
first); it also dies with the test process, so a killed pytest leaves nothing behind
(``hangwatch.demo.processes``). Request sizes come from the decode rate measured here
(:meth:`LlamaServer.n_predict_lasting`), not from one machine's numbers.

Load goes through llama.cpp's native ``POST /completion``; hangwatch's idle probe uses
``POST /v1/completions``. Every request, ours or the probe, becomes one slot task, which the
server logs as ``processing task``: counting those lines (and ``tokens_predicted_total``)
proves from llama.cpp's own side whether a probe was sent.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from hangwatch.demo.processes import Process, start_server
from hangwatch.demo.wait import WaitTimeout, wait_until
from tests.support import stopped

MODEL_FILE = "hangwatch-1024x12-f16.gguf"
MEASUREMENTS = Path(__file__).resolve().parents[1] / "data" / "llamacpp" / "measurements.json"
SLOTS = 4
CONTEXT = 4096
THREADS = 1  # see start(): a loaded machine must not change the rate by 10x
BATCH = 4096  # -b and -ub: one 3,900-token prompt is ONE llama_decode() call (REAL-PARTS)
# One slot task's first and last log lines (llama-server's SLT_INF, at its default verbosity).
TASK_STARTED, TASK_ENDED = "processing task", "stop processing"


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
    """One llama-server on port 0 (the port it bound is read back), its log in a temp dir."""

    def __init__(self):
        self.logdir = tempfile.mkdtemp(prefix="hangwatch-llamacpp-")
        self.log_path = os.path.join(self.logdir, "server.log")
        self.process: Process | None = None
        self.frozen = False
        self._rate: float | None = None
        self._prompt_ms_per_token: float | None = None  # prompt_tokens_lasting's measurement

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def proc(self):
        return None if self.process is None else self.process.popen

    # --- life cycle ----------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        args = [server_binary(), "-m", model_path(), "--metrics", "--slots", "--host", "127.0.0.1",
                "--port", "0", "-np", str(SLOTS), "-c", str(CONTEXT),
                # unified KV: any one slot may hold a ~3,900-token prompt; one batch for it
                "--kv-unified", "-b", str(BATCH), "-ub", str(BATCH), "--no-webui",
                # one compute thread: ggml's threads spin at every op's barrier, so on a loaded
                # two-core machine one descheduled thread stalls the other — measured with one
                # core kept busy (--cpu-hog): 82 ms/token with two threads, 38 with one (as idle)
                "-t", str(THREADS), "-tb", str(THREADS)]
        self.process = start_server("llama-server", args, self.log_path, "/health", deadline=timeout,
                                    cwd=self.logdir)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.stop(timeout=15)
        self.process = None
        self.frozen = False
        if not os.environ.get("HANGWATCH_KEEP_LOGS"):
            shutil.rmtree(self.logdir, ignore_errors=True)

    def freeze(self) -> None:
        """kill -STOP: every thread stops; connections are accepted and never answered. Returns once
        every thread has stopped (a reading sent at once could otherwise still be answered)."""
        self.process.check_alive()
        self.frozen = True
        stopped.stop(self.process.pid, "llama-server")

    def thaw(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGCONT)
        self.frozen = False

    def wait_progress(self, since: str, batches: int = 3, deadline_s: float = 30) -> str:
        """After :meth:`thaw`: the first page with ``batches`` more decode batches than
        ``since`` (read just before the freeze: at most one batch ran between that read and
        the SIGSTOP, so three prove decoding resumed)."""
        return self.wait_until(lambda t: (metric(t, "llamacpp:n_decode_total") or 0)
                               >= (metric(since, "llamacpp:n_decode_total") or 0) + batches, deadline_s,
                               "decoding again after SIGCONT")

    def tokens_per_second(self) -> float:
        """One request's decode rate alone: the higher of a measurement here and the one in
        ``tests/data/llamacpp/measurements.json`` (taken on an idle machine). A machine busy
        with other work measures low, and sizing requests by a low rate would make them end
        too soon once the other work stops; the higher rate only makes them last longer."""
        if self._rate is None:
            n = 128
            started = time.monotonic()
            load = self.completions(1, n_predict=n)
            load.wait(120)
            assert not load.errors, load.errors
            measured = n / (time.monotonic() - started)
            self._rate = max(measured, json.loads(MEASUREMENTS.read_text())["one_request_tokens_per_second"])
        return self._rate

    def n_predict_lasting(self, seconds: float, concurrent: int = 1, prompt_tokens: int = 64) -> int:
        """Tokens for a request that decodes for at least ``seconds`` — at the rate of one
        request alone, so with others beside it, it lasts longer still — within what
        ``concurrent`` such requests (after ``prompt_tokens`` each) fit in the shared KV cache."""
        fits = CONTEXT // max(1, concurrent) - prompt_tokens
        wanted = int(self.tokens_per_second() * seconds) + 1
        assert wanted <= fits, (f"{wanted} tokens ({seconds} s at {self.tokens_per_second():.0f}/s) "
                                f"do not fit {concurrent} to a {CONTEXT}-token cache")
        return wanted

    def prompt_tokens_lasting(self, seconds: float, most: int = 3800) -> int:
        """Tokens for one prompt whose one batch (``-b``/``-ub`` BATCH) takes about ``seconds``
        on this machine, at most ``most``. The batch must outlast several readings and stay
        inside llama.cpp's grace (``min_grace``, 30 s: by the rule a longer silent batch is a
        hang): with one compute thread a 3,800-token batch took 8–11 s on one machine and 29 s on
        another. Sized from a 1,000-token prompt's own ``prompt_ms`` on this server; a longer
        prompt costs more per token (attention grows with it), so the batch runs longer than
        ``seconds``, never shorter."""
        if self._prompt_ms_per_token is None:
            load = self.completions(1, n_predict=1, prompt=self.prompt_of(1000), timeout=120)
            load.wait(130)
            assert not load.errors and load.results, load.errors
            timings = load.results[0]["timings"]
            self._prompt_ms_per_token = timings["prompt_ms"] / max(1, timings["prompt_n"])
        return max(1000, min(most, int(seconds * 1000 / self._prompt_ms_per_token)))

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
        return self.process.log_text()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def tasks_launched(self) -> int:
        """Slot tasks the server started (one per request: ours and any probe), as its log says
        so far; to count, use :meth:`tasks_logged`."""
        return self.log_text().count(TASK_STARTED)

    def tasks_logged(self, in_flight: int = 0, at_least: int = 0, deadline_s: float = 30) -> int:
        """Slot tasks started, once the log shows exactly ``in_flight`` of them without their end
        and at least ``at_least`` started. llama.cpp writes its log from a thread of its own: a
        count read the moment a request was answered (or ``/metrics`` said idle) can miss the
        lines of tasks already done, and a "before" read so would count them later as new."""
        def settled():
            text = self.log_text()
            started, ended = text.count(TASK_STARTED), text.count(TASK_ENDED)
            return (started,) if started - ended == in_flight and started >= at_least else None
        try:
            return wait_until(settled, deadline_s, f"the log to show every task's start and end "
                                                   f"({in_flight} running, {at_least} or more started)")[0]
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}\n{self.log_tail()}") from None

    def wait_until(self, predicate, deadline_s: float, what: str, interval: float = 0.1) -> str:
        """Poll /metrics until ``predicate(text)``; return that page."""
        last = [""]

        def page():
            last[0] = self.metrics_text()
            return last[0] if predicate(last[0]) else None
        try:
            return wait_until(page, deadline_s, what, interval=interval, ignore=(requests.RequestException,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; last page:\n{last[0]}") from None

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
