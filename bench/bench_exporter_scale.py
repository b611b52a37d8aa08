#!/usr/bin/env python3
"""How many backends one exporter carries: scrapes spread over the interval, and bursts.

The fleet (``bench/fleet.py``): N real-vLLM-shaped backends, each on its own port of one
local asyncio process, answering the captured busy vLLM 0.32 page (so no idle probe is
due). The load (``bench/scrapeload.py``): Prometheus' shape — one keep-alive client, each
target scraped once per interval at its own offset, a 10 s scrape timeout; and a burst, every
target at once on fresh connections (a Prometheus restart, several replicas starting).

Measured on the exporter process, from /proc: CPU seconds per backend-scrape over the
measured rounds, resident memory and its peak, threads. Latency is from a scrape's
scheduled start to the last byte of its answer; a failure is no complete 200 answer saying
``hangwatch_up 1`` within the timeout.

    python bench/bench_exporter_scale.py [--backends 100,1000,5000] [--interval 15s]
        [--rounds 2] [--burst 100,1000,5000] [--exporter-ref COMMIT] [--json FILE]

``--exporter-ref`` runs an older commit's exporter with this tree's benchmark (the "before"
numbers). Run under ``flock /tmp/hw/heavy.lock``; the machine's load is printed with the results.
"""
from __future__ import annotations

import argparse
import signal
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from processes import Exporter, Fleet, raise_fd_limit  # noqa: E402
from procstat import loadavg, sample  # noqa: E402
from scrapeload import Result, Scraper, burst, spread  # noqa: E402

TIMEOUT = 10.0  # the example Prometheus config's scrape_timeout


def probe_paths(urls: list[str]) -> list[str]:
    return [f"/probe?target={url}&module=backend" for url in urls]


class Watch:
    """Samples the exporter's threads and memory while a run goes on."""

    def __init__(self, pid: int):
        self.pid, self.max_threads, self.max_rss, self.max_fds = pid, 0, 0, 0

    async def run(self):
        while True:
            try:
                s = sample(self.pid)
            except OSError:
                return
            self.max_threads = max(self.max_threads, s.threads)
            self.max_rss = max(self.max_rss, s.rss)
            self.max_fds = max(self.max_fds, s.fds)
            await asyncio.sleep(0.25)


def summary(shape: str, n: int, result: Result, cpu: float | None, seconds: float | None,
            watch: Watch, pid: int, system: float | None = None) -> dict:
    now = sample(pid)
    row = {
        "shape": shape, "backends": n, "scrapes": result.started, "failed": result.failed,
        "failures": result.failures, "p50_ms": result.quantile(0.5) * 1000,
        "p99_ms": result.quantile(0.99) * 1000,
        "max_ms": (max(result.latencies) * 1000) if result.latencies else float("nan"),
        "rss_mb": now.rss / 2**20, "peak_rss_mb": now.peak_rss / 2**20, "max_rss_mb": watch.max_rss / 2**20,
        "max_threads": watch.max_threads, "max_fds": watch.max_fds, "load": loadavg(),
    }
    if cpu is not None:
        row["cpu_ms_per_scrape"] = cpu / max(1, result.started) * 1000
        row["core_percent"] = cpu / seconds * 100
        row["seconds"] = seconds
        if system is not None:
            row["system_share"] = system / cpu if cpu else float("nan")  # kernel part of that CPU
    return row


async def run_spread(exporter: Exporter, urls: list[str], interval: float, rounds: int) -> dict:
    scraper = Scraper("127.0.0.1", exporter.port, TIMEOUT)
    watch = Watch(exporter.pid)
    watcher = asyncio.create_task(watch.run())
    marks = []
    result = await spread(scraper, probe_paths(urls), interval, rounds,
                          on_window=lambda: marks.append((time.monotonic(), sample(exporter.pid))))
    watcher.cancel()
    scraper.close()
    (t0, s0), (t1, s1) = marks
    return summary("spread", len(urls), result, s1.cpu - s0.cpu, t1 - t0, watch, exporter.pid, s1.system - s0.system)


async def run_burst(exporter: Exporter, urls: list[str]) -> dict:
    scraper = Scraper("127.0.0.1", exporter.port, TIMEOUT)
    watch = Watch(exporter.pid)
    watcher = asyncio.create_task(watch.run())
    s0, t0 = sample(exporter.pid), time.monotonic()
    result = await burst(scraper, probe_paths(urls))
    s1, t1 = sample(exporter.pid), time.monotonic()
    watcher.cancel()
    scraper.close()
    return summary("burst", len(urls), result, s1.cpu - s0.cpu, t1 - t0, watch, exporter.pid, s1.system - s0.system)


def show(row: dict) -> str:
    cpu = (f"{row['cpu_ms_per_scrape']:6.2f} ms {row['core_percent']:5.1f}% {row.get('system_share', 0) * 100:3.0f}%"
           if "cpu_ms_per_scrape" in row else f"{'':22}")
    failures = ", ".join(f"{k}: {v}" for k, v in row["failures"].items())
    return (f"{row['shape']:6} {row['backends']:6d} {row['scrapes']:7d} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} "
            f"{row['max_ms']:8.1f} {row['failed']:6d}  {cpu} {row['rss_mb']:6.1f} {row['max_rss_mb']:6.1f} "
            f"{row['max_threads']:5d} {row['max_fds']:5d}  [{row['load']}] {failures}")


HEADER = (f"{'shape':6} {'backs':>6} {'scrapes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'failed':>6}  "
          f"{'CPU/scrape':>9} {'core':>6} {'sys':>4} {'RSS':>6} {'maxRSS':>6} {'thrds':>5} {'fds':>5}  [load 1/5/15 min]")


def parse_seconds(text: str) -> float:
    return float(text[:-1]) if text.endswith("s") else float(text)


async def main_async(args) -> list[dict]:
    rows = []
    sizes = sorted(set(args.backends) | set(args.burst))
    print(HEADER, flush=True)
    for n in sizes:
        fleet = Fleet(n)
        try:
            with tempfile.TemporaryDirectory(prefix="hangwatch-bench-") as workdir:
                exporter = Exporter(Path(workdir), args.config, args.exporter_ref)
                try:
                    if n in args.backends:
                        rows.append(await run_spread(exporter, fleet.urls(), args.interval, args.rounds))
                        print(show(rows[-1]), flush=True)
                    if n in args.burst:
                        rows.append(await run_burst(exporter, fleet.urls()))
                        print(show(rows[-1]), flush=True)
                finally:
                    exporter.stop()
        finally:
            fleet.stop()
    return rows


def sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _exit_on_sigterm() -> None:
    """SIGTERM (a timeout, Ctrl-C's cousin) runs the finally blocks that stop every process."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the exporter under many backends")
    parser.add_argument("--backends", type=sizes, default=[100, 1000, 5000], help="spread runs (comma list)")
    parser.add_argument("--burst", type=sizes, default=[100, 1000, 5000], help="burst runs (comma list)")
    parser.add_argument("--interval", type=parse_seconds, default=15.0, help="scrape interval (default 15s)")
    parser.add_argument("--rounds", type=int, default=2, help="measured intervals after one warm-up")
    parser.add_argument("--exporter-ref", default=None, help="run this git commit's exporter (before numbers)")
    parser.add_argument("--config", default="", help="exporter config YAML text")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    raise_fd_limit()
    _exit_on_sigterm()
    print(f"exporter: {args.exporter_ref or 'this tree'}; interval {args.interval:g}s, timeout {TIMEOUT:g}s, "
          f"load before: {loadavg()}", flush=True)
    rows = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
