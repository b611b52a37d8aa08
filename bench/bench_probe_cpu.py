#!/usr/bin/env python3
"""The exporter's CPU per ``/probe`` of a BUSY backend: one GET /metrics of a real vLLM page,
its parse and the answer's render — the path every busy backend costs on every scrape.

    flock /work/heavy.lock python bench/bench_probe_cpu.py [--scrapes 2000] [--rounds 3]
        [--loops uvloop,asyncio] [--exporter-ref 5784e32,0b9007b] [--concurrency 50]

The backends are ``bench/fleet.py`` (another process: the captured busy vLLM 0.32 page, its
counters moving with every answer, 4 requests running so no idle probe is due); the exporter is
``hangwatch exporter`` on port 0 (``processes.Exporter``; ``--exporter-ref`` also starts an older
commit's). The scraper is this process, a keep-alive client like Prometheus'. Counted: the
exporter's own user+system time (/proc/PID/stat) across ``--scrapes`` scrapes, as
- **sequential**: one target, one scrape at a time (a reading's whole path, nothing amortized);
- **concurrent**: ``--concurrency`` targets scraped at once, wave after wave (the loop's batching).
The fleet gzips a page only for a client that asks (as vLLM does); hangwatch asks identity.
Prints a markdown table: µs of exporter CPU per scrape, min–median over rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from processes import Exporter, Fleet, has_evloop  # noqa: E402
from procstat import loadavg, sample  # noqa: E402
from scrapeload import Result, Scraper  # noqa: E402


async def _scrapes(port: int, paths: list[str], count: int, concurrency: int) -> Result:
    """``count`` scrapes of ``paths`` in turn, ``concurrency`` at a time (each wave waits for its last)."""
    scraper = Scraper("127.0.0.1", port, timeout=10.0)
    result = Result()
    try:
        done = 0
        while done < count:
            wave = min(concurrency, count - done)
            await asyncio.gather(*(scraper.scrape(paths[(done + i) % len(paths)], result) for i in range(wave)))
            done += wave
    finally:
        scraper.close()
    return result


def measure(pid: int, port: int, paths: list[str], count: int, concurrency: int) -> float:
    """µs of the exporter's CPU per scrape over ``count`` scrapes (after a warm-up of one wave per path)."""
    warm = asyncio.run(_scrapes(port, paths, max(len(paths), concurrency) * 2, concurrency))
    if warm.failed:
        raise RuntimeError(f"warm-up scrapes failed: {warm.failures}")
    before = sample(pid).cpu
    result = asyncio.run(_scrapes(port, paths, count, concurrency))
    used = sample(pid).cpu - before
    if result.failed:
        raise RuntimeError(f"{result.failed} scrapes failed: {result.failures}")
    return used / count * 1e6


def loops_for(ref: str | None, asked: list[str]) -> list[str]:
    """The loops a tree can run from those asked (an evloop tree runs evloop in place of asyncio)."""
    if has_evloop(ref):
        return ["evloop" if loop == "asyncio" else loop for loop in asked]
    return [loop for loop in asked if loop != "evloop"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--loops", default="uvloop,asyncio")
    parser.add_argument("--exporter-ref", default="", help="also measure these commits' exporters, comma-separated "
                        "(e.g. 5784e32: before issue 34)")
    args = parser.parse_args(argv)
    asked = [loop.strip() for loop in args.loops.split(",") if loop.strip()]
    refs = [ref.strip() for ref in args.exporter_ref.split(",") if ref.strip()]
    trees = [(ref, ref) for ref in refs] + [(None, "this tree")]
    fleet = Fleet(max(1, args.concurrency))
    rows = []
    try:
        query = "&module=backend"
        urls = fleet.urls()
        sequential = [f"/probe?target={urls[0]}{query}"]
        concurrent = [f"/probe?target={url}{query}" for url in urls]
        with tempfile.TemporaryDirectory(prefix="bench-probe-cpu-") as tmp:
            for ref, name in trees:
                for loop in loops_for(ref, asked):
                    workdir = Path(tempfile.mkdtemp(dir=tmp))
                    exporter = Exporter(workdir, ref=ref, loop=loop)
                    try:
                        seq, conc = [], []
                        for _ in range(args.rounds):
                            seq.append(measure(exporter.pid, exporter.port, sequential, args.scrapes, 1))
                            conc.append(measure(exporter.pid, exporter.port, concurrent, args.scrapes,
                                                args.concurrency))
                        rows.append((name, loop, seq, conc))
                        print(f"{name} {loop}: sequential {_span(seq)}, concurrent {_span(conc)} µs/scrape",
                              file=sys.stderr, flush=True)
                    finally:
                        exporter.stop()
    finally:
        fleet.stop()
    print(f"\n{args.scrapes} scrapes per round, {args.rounds} rounds; concurrent: {args.concurrency} targets at "
          f"once; load average after: {loadavg()}\n")
    print("| exporter | loop | sequential µs/scrape (min / median) | concurrent µs/scrape (min / median) |")
    print("|---|---|---|---|")
    for name, loop, seq, conc in rows:
        print(f"| {name} | {loop} | {_span(seq)} | {_span(conc)} |")
    return 0


def _span(values: list[float]) -> str:
    return f"{min(values):.0f} / {statistics.median(values):.0f}"


if __name__ == "__main__":
    sys.exit(main())
