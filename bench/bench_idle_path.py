"""Benchmark: hangwatch's CPU per idle ``observe_backend`` (issue 34, "idle ≤ 1.0×").

An idle backend is the expensive path: two /metrics readings ``IDLE_CONFIRM_S`` apart, the
probe's model, the 1-token completion. ``bench/idle_backends.py`` serves the captured vLLM 0.32
idle page from another process; this one observes every backend concurrently on one event loop,
round after round (the first round, which connects and learns the model, is not counted), and
takes the process's CPU time (all its threads) per observe. It then splits that cost:

- ``core``: the same observes over a client that answers from memory (no I/O): parsing, the
  decisions, JSON, the confirmation timer — what stays whichever HTTP client lands;
- ``transport``: the rest (the client, its threads or protocol, the sockets);
- per piece: one parse of the page, one gunzip, the model list's JSON, timed alone.

Run (the machine is shared): ``flock /work/heavy.lock nice -n 19 python bench/bench_idle_path.py``;
``--profile`` adds the core's cProfile; ``--gzip`` asks for gzipped pages.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gzip
import inspect
import json
import pathlib
import pstats
import subprocess
import sys
import time
from dataclasses import replace

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hangwatch import reading  # noqa: E402
from hangwatch.client import Client, Fetched  # noqa: E402
from hangwatch.deadline import Deadline  # noqa: E402
from hangwatch.observation import OK, Options  # noqa: E402
from hangwatch.observe import observe_backend  # noqa: E402
from hangwatch.reading import parse  # noqa: E402

DATA = ROOT / "tests" / "data" / "vllm-0.32"
PAGE = (DATA / "idle.prom").read_bytes()
MODELS = (DATA / "models.json").read_bytes()
COMPLETION = (DATA / "completion-max-tokens-1.json").read_bytes()
OPTIONS = Options(engine="vllm")

try:  # the model memo, once it exists (so the same bench measures before and after)
    from hangwatch.models_memo import ModelMemo
except ImportError:
    ModelMemo = None
TAKES_MEMO = "known" in inspect.signature(observe_backend).parameters


class GzipClient:
    """The client asking for gzipped pages and inflating them, as a gzip-asking client would."""

    def __init__(self, client):
        self.client = client

    async def request(self, method, url, *, headers=None, **kwargs):
        fetched = await self.client.request(method, url, headers={**(headers or {}), "Accept-Encoding": "gzip"},
                                            **kwargs)
        if fetched.body[:2] == b"\x1f\x8b":
            fetched = replace(fetched, body=gzip.decompress(fetched.body))
        return fetched

    def close(self):
        self.client.close()


class MemoryClient:
    """Answers every request from memory at once: an observe's cost without any transport."""

    def __init__(self, gzipped: bool = False):
        self.page = gzip.compress(PAGE) if gzipped else PAGE
        self.gzipped = gzipped
        self.sent = 0

    async def request(self, method, url, *, deadline, max_bytes=0, json=None, headers=None):
        self.sent += 1
        path = url.split("/", 3)[3]
        if path == "metrics":
            body = gzip.decompress(self.page) if self.gzipped else self.page
        elif path == "v1/models":
            body = MODELS
        else:
            body = COMPLETION
        return Fetched(OK, body=body, http_status=200, elapsed=0.0005)


def memo_for(use_memo: bool):
    return ModelMemo() if (use_memo and ModelMemo is not None) else None


async def observe_all(client, urls: list[str], rounds: int, use_memo: bool) -> dict:
    """Observe every url concurrently, ``rounds`` times after one uncounted round."""
    memo = memo_for(use_memo)
    extra = {"known": memo} if (TAKES_MEMO and memo is not None) else {}

    async def one_round():
        observations = await asyncio.gather(*(observe_backend(client, url, Deadline.after(30), OPTIONS, **extra)
                                              for url in urls))
        probed = sum(1 for o in observations if o.probe is not None and o.probe.success)
        if probed != len(urls):
            bad = next(o for o in observations if o.probe is None or not o.probe.success)
            raise SystemExit(f"only {probed}/{len(urls)} observes probed successfully: {bad}")

    await one_round()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await one_round()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_ms_per_observe": cpu * 1000 / (rounds * len(urls)), "wall_s_per_round": wall / rounds}


def per_call_us(fn, n: int = 2000) -> float:
    fn()
    started = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - started) * 1e6 / n


def pieces() -> dict:
    squeezed = gzip.compress(PAGE)
    kept = getattr(reading, "READINGS_KEPT", None)
    if kept is not None:
        reading.READINGS_KEPT = 0
        reading._made.clear()
    fresh = per_call_us(lambda: parse(PAGE, "vllm"))
    if kept is not None:
        reading.READINGS_KEPT = kept
    return {
        "parse_idle_page_us": fresh,
        "parse_idle_page_again_us": per_call_us(lambda: parse(PAGE, "vllm")),  # its Reading kept, if it can be
        "gunzip_idle_page_us": per_call_us(lambda: gzip.decompress(squeezed)),
        "models_json_us": per_call_us(lambda: json.loads(MODELS)),
        "page_bytes": len(PAGE), "page_gzip_bytes": len(squeezed),
    }


def with_backends(count: int):
    server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "idle_backends.py"), str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ports = json.loads(server.stdout.readline())["ports"]
    return server, [f"http://127.0.0.1:{port}" for port in ports]


def served_by(server) -> dict:
    server.stdin.close()
    served = json.loads(server.stdout.readline())["served"]
    server.wait(10)
    return served


def profile_core(urls: list[str], rounds: int, use_memo: bool, top: int = 18) -> None:
    client = MemoryClient()
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(observe_all(client, urls, rounds, use_memo))
    profiler.disable()
    stats = pstats.Stats(profiler)
    by_file: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        key = pathlib.Path(filename).name if "hangwatch" in filename else (
            "asyncio" if "asyncio" in filename else "json" if "json" in filename else
            "dataclasses" if "dataclasses" in filename else filename if filename.startswith("<") else "other")
        by_file[key] = by_file.get(key, 0.0) + tottime
    total = sum(by_file.values())
    print("core profile (own time by file):")
    for key, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:12]:
        print(f"  {key:40} {seconds / total * 100:5.1f}%")
    stats.sort_stats("tottime").print_stats(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gzip", action="store_true", help="ask for gzipped pages (and inflate them)")
    parser.add_argument("--no-memo", action="store_true", help="ask /v1/models before every probe")
    parser.add_argument("--no-kept-readings", action="store_true", help="parse every page anew")
    parser.add_argument("--profile", action="store_true", help="print the core's cProfile")
    parser.add_argument("--uvloop", action="store_true", help="run the measured loop on uvloop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop
        uvloop.install()
    use_memo = not args.no_memo
    if args.no_kept_readings and hasattr(reading, "READINGS_KEPT"):
        reading.READINGS_KEPT = 0
    results = {"backends": args.backends, "rounds": args.rounds, "gzip": args.gzip,
               "memo": use_memo and TAKES_MEMO and ModelMemo is not None,
               "kept_readings": getattr(reading, "READINGS_KEPT", 0)}

    server, urls = with_backends(args.backends)
    client = Client(max_idle=2 * args.backends)
    try:
        measured = GzipClient(client) if args.gzip else client
        results["total"] = asyncio.run(observe_all(measured, urls, args.rounds, use_memo))
    finally:
        client.close()
        served = served_by(server)
    observes = (args.rounds + 1) * args.backends
    results["requests_per_observe"] = {path: round(count / observes, 3) for path, count in sorted(served.items())}

    memory = MemoryClient(gzipped=args.gzip)
    results["core"] = asyncio.run(observe_all(memory, urls, args.rounds, use_memo))
    results["core"]["requests_per_observe"] = round(memory.sent / observes, 3)
    results["transport_cpu_ms_per_observe"] = (results["total"]["cpu_ms_per_observe"]
                                               - results["core"]["cpu_ms_per_observe"])
    results["pieces"] = pieces()
    print(json.dumps(results, indent=2))
    if args.profile:
        profile_core(urls, args.rounds, use_memo)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
