"""The soak's clients: a saturating load and the naive watchdog people run today.

How it measures: bench/README.md.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import requests

from harness import tinymodel
from harness.vllm_server import MODEL_NAME, Generation


class InFlight:
    """Open requests of the load and the watchdog, by kind; safe across threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def opened(self, kind: str) -> None:
        with self._lock:
            self._open[kind] = self._open.get(kind, 0) + 1

    def closed(self, kind: str) -> None:
        with self._lock:
            self._open[kind] -= 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in self._open.items() if v}

    def total(self) -> int:
        with self._lock:
            return sum(self._open.values())


@dataclass
class Request:
    """One request of the load or the watchdog, as its client saw it (monotonic times)."""
    kind: str                    # "generation", "prefill" or "naive"
    sent_at: float
    ended_at: float = 0.0
    ok: bool = False
    error: str = ""
    tokens: int = 0              # completion tokens the server reported (usage)
    prompt_tokens: int = 0
    wanted_tokens: int = 0


class Load:
    """Keep a vLLM saturated until :meth:`stop`: long generations and long chunked prefills."""

    def __init__(self, url: str, in_flight: InFlight, *, generators: int = 6, prefills: int = 1,
                 gen_tokens: tuple[int, int] = (1000, 4000), prefill_tokens: tuple[int, int] = (8000, 32000),
                 prefill_answer: int = 16, request_deadline_s: float = 300, seed: int = 15):
        self.url, self.in_flight = url, in_flight
        self.gen_tokens, self.prefill_tokens = gen_tokens, prefill_tokens
        self.prefill_answer = prefill_answer
        self.request_deadline_s = request_deadline_s
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._current: set[Generation] = set()
        self._sent = 0
        self._rng = random.Random(seed)
        self._prompt_offset = self._rng.randrange(tinymodel.N_WORDS)
        self._threads = [threading.Thread(target=self._client, args=("generation",), daemon=True,
                                          name=f"soak-gen-{i}") for i in range(generators)]
        self._threads += [threading.Thread(target=self._client, args=("prefill",), daemon=True,
                                           name=f"soak-prefill-{i}") for i in range(prefills)]

    def start(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def _next(self, kind: str) -> tuple[str, int, int]:
        """(prompt, max_tokens, prompt tokens) of the next request of this kind."""
        with self._lock:
            if kind == "generation":
                n = self._rng.randint(*self.gen_tokens)
                return f"hello world w{self._rng.randrange(tinymodel.N_WORDS)}", n, 0
            n = self._rng.randint(*self.prefill_tokens)
            # A new starting word each time: no two long prompts share a prefix-cache block.
            self._prompt_offset = (self._prompt_offset + 7919) % tinymodel.N_WORDS
            return tinymodel.long_prompt(n, self._prompt_offset), self.prefill_answer, n

    def _client(self, kind: str) -> None:
        while not self._stop.is_set():
            prompt, max_tokens, prompt_tokens = self._next(kind)
            record = Request(kind, time.monotonic(), wanted_tokens=max_tokens, prompt_tokens=prompt_tokens)
            self.in_flight.opened(kind)
            with self._lock:
                self._sent += 1
            try:
                generation = Generation(self.url, prompt, max_tokens, self.request_deadline_s, MODEL_NAME)
                with self._lock:
                    self._current.add(generation)
                if self._stop.is_set():
                    generation.cancel()  # stop() ran between our check and the send
                generation.join()
            finally:
                self.in_flight.closed(kind)
            record.ended_at = time.monotonic()
            with self._lock:
                self._current.discard(generation)
            usage = generation.usage or {}
            record.tokens = int(usage.get("completion_tokens") or 0)
            record.ok = bool(generation.done and not generation.error and record.tokens == max_tokens)
            record.error = generation.error or ("" if record.ok else
                                                f"ended after {record.tokens} of {max_tokens} tokens")
            if self._stop.is_set() and not record.ok:
                continue  # cancelled by stop(): not the server's failure
            with self._lock:
                self.requests.append(record)

    def stop(self, cancel: bool = True, join_s: float = 600) -> None:
        """No new requests; ``cancel`` aborts the open ones, else they run to their end."""
        self._stop.set()
        if cancel:
            with self._lock:
                current = list(self._current)
            for generation in current:
                generation.cancel()
        deadline = time.monotonic() + join_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def finished(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def sent(self) -> int:
        """Requests sent so far (finished, cancelled or open): what vLLM should count."""
        with self._lock:
            return self._sent


@dataclass
class NaiveWatchdog:
    """A real chat request with a ``timeout_s`` timeout every ``interval_s``; ``failures`` in a
    row is a restart (counted, not done: a dry run), after which the streak starts again."""
    url: str
    in_flight: InFlight
    interval_s: float = 10.0
    timeout_s: float = 5.0
    failures: int = 3
    max_tokens: int = 8
    checks: list[Request] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)     # monotonic times of restart decisions

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-naive-watchdog")

    def start(self) -> "NaiveWatchdog":
        self._thread.start()
        return self

    def _run(self) -> None:
        session = requests.Session()
        streak, next_at = 0, time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval_s
            record = Request("naive", time.monotonic(), wanted_tokens=self.max_tokens)
            self.in_flight.opened("naive")
            try:
                response = session.post(f"{self.url}/v1/chat/completions", timeout=(self.timeout_s, self.timeout_s),
                                        json={"model": MODEL_NAME, "max_tokens": self.max_tokens,
                                              "messages": [{"role": "user", "content": "ping"}]})
                record.ok = response.status_code == 200
                record.error = "" if record.ok else f"HTTP {response.status_code}"
                if record.ok:
                    record.tokens = int(response.json().get("usage", {}).get("completion_tokens") or 0)
            except requests.RequestException as exc:
                record.error = type(exc).__name__
                session.close()  # a timed-out connection is not reused
                session = requests.Session()
            finally:
                self.in_flight.closed("naive")
            record.ended_at = time.monotonic()
            if record.ok and record.ended_at - record.sent_at > self.timeout_s:
                record.ok, record.error = False, f"answered after {record.ended_at - record.sent_at:.1f} s"
            streak = 0 if record.ok else streak + 1
            with self._lock:
                self.checks.append(record)
                if streak >= self.failures:
                    self.restarts.append(record.ended_at)
                    streak = 0
        session.close()

    def stop(self, join_s: float = 30) -> None:
        self._stop.set()
        self._thread.join(join_s)

    def snapshot(self) -> tuple[list[Request], list[float]]:
        with self._lock:
            return list(self.checks), list(self.restarts)
