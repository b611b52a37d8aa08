#!/usr/bin/env python3
"""How many backends one exporter carries, and at what CPU beside blackbox_exporter's.

    python bench/bench_exporter_scale.py [--backends 100,1000,5000] [--interval 15s]
        [--rounds 2] [--burst 100,1000,5000] [--loops evloop,uvloop] [--no-blackbox]
        [--repeat N] [--shift K] [--static-fleet] [--exporter-ref COMMIT] [--json FILE]
    python bench/bench_exporter_scale.py --summarize run1.json run2.json ...

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from processes import BLACKBOX_MODULE, Blackbox, Exporter, Fleet, raise_fd_limit  # noqa: E402
from procstat import loadavg, sample  # noqa: E402
from scrapeload import Result, Scraper, burst, spread  # noqa: E402

TIMEOUT = 10.0  # the example Prometheus config's scrape_timeout
BLACKBOX = "blackbox"


def probe_paths(urls: list[str], subject: str) -> list[str]:
    if subject == BLACKBOX:
        return [f"/probe?target={url}/metrics&module={BLACKBOX_MODULE}" for url in urls]
    return [f"/probe?target={url}&module=backend" for url in urls]


def expected(subject: str) -> bytes:
    return b"probe_success 1" if subject == BLACKBOX else b"hangwatch_up 1"


class Watch:
    """Samples a process' threads and memory while a run goes on."""

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


def summary(subject: str, shape: str, n: int, result: Result, marks: list, watch: Watch, pid: int,
            repeat: int) -> dict:
    """``marks``: [(monotonic, subject's sample, fleet's sample)] at the window's start and end."""
    now = sample(pid)
    row = {
        "subject": subject, "repeat": repeat,
        "shape": shape, "backends": n, "scrapes": result.started, "failed": result.failed,
        "failures": result.failures, "p50_ms": result.quantile(0.5) * 1000,
        "p99_ms": result.quantile(0.99) * 1000,
        "max_ms": (max(result.latencies) * 1000) if result.latencies else float("nan"),
        "rss_mb": now.rss / 2**20, "peak_rss_mb": now.peak_rss / 2**20, "max_rss_mb": watch.max_rss / 2**20,
        "max_threads": watch.max_threads, "max_fds": watch.max_fds, "load": loadavg(),
    }
    (t0, s0, f0), (t1, s1, f1) = marks
    cpu, seconds, scrapes = s1.cpu - s0.cpu, t1 - t0, max(1, result.started)
    row["cpu_ms_per_scrape"] = cpu / scrapes * 1000
    row["core_percent"] = cpu / seconds * 100
    row["seconds"] = seconds
    row["system_share"] = (s1.system - s0.system) / cpu if cpu else float("nan")  # the kernel's part
    row["fleet_cpu_ms_per_scrape"] = (f1.cpu - f0.cpu) / scrapes * 1000
    return row


def _mark(pid: int, fleet_pid: int) -> tuple:
    return time.monotonic(), sample(pid), sample(fleet_pid)


async def run_spread(subject: str, port: int, pid: int, fleet: Fleet, interval: float, rounds: int,
                     repeat: int) -> dict:
    scraper = Scraper("127.0.0.1", port, TIMEOUT, expect=expected(subject))
    watch = Watch(pid)
    watcher = asyncio.create_task(watch.run())
    marks = []
    result = await spread(scraper, probe_paths(fleet.urls(), subject), interval, rounds,
                          on_window=lambda: marks.append(_mark(pid, fleet.pid)))
    watcher.cancel()
    scraper.close()
    return summary(subject, "spread", len(fleet.urls()), result, marks, watch, pid, repeat)


async def run_burst(subject: str, port: int, pid: int, fleet: Fleet, repeat: int) -> dict:
    scraper = Scraper("127.0.0.1", port, TIMEOUT, expect=expected(subject))
    watch = Watch(pid)
    watcher = asyncio.create_task(watch.run())
    marks = [_mark(pid, fleet.pid)]
    result = await burst(scraper, probe_paths(fleet.urls(), subject))
    marks.append(_mark(pid, fleet.pid))
    watcher.cancel()
    scraper.close()
    return summary(subject, "burst", len(fleet.urls()), result, marks, watch, pid, repeat)


def show(row: dict) -> str:
    failures = ", ".join(f"{k}: {v}" for k, v in row["failures"].items())
    return (f"{row['subject']:9} {row['shape']:6} {row['backends']:6d} {row['scrapes']:7d} {row['p50_ms']:8.1f} "
            f"{row['p99_ms']:8.1f} {row['max_ms']:8.1f} {row['failed']:6d}  {row['cpu_ms_per_scrape']:6.2f} ms "
            f"{row['core_percent']:5.1f}% {row.get('system_share', 0) * 100:3.0f}% "
            f"{row['fleet_cpu_ms_per_scrape']:6.2f} {row['rss_mb']:6.1f} {row['max_rss_mb']:6.1f} "
            f"{row['max_threads']:5d} {row['max_fds']:5d}  [{row['load']}] {failures}")


HEADER = (f"{'subject':9} {'shape':6} {'backs':>6} {'scrapes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'failed':>6}  {'CPU/scrape':>9} {'core':>6} {'sys':>4} {'fleet':>6} {'RSS':>6} {'maxRSS':>6} "
          f"{'thrds':>5} {'fds':>5}  [load 1/5/15 min]")


def medians(rows: list[dict]) -> str:
    """Per (shape, backends, subject): the median CPU per scrape over the repeats, then the
    ratios each hangwatch loop / blackbox_exporter and uvloop / evloop."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["shape"], row["backends"], row["subject"]), []).append(row)
    lines = ["", "medians over the repeats (CPU per scrape; p50 / p99 latency; failed; max RSS):"]
    median_cpu = {}
    for (shape, n, subject), group in sorted(groups.items()):
        cpu = statistics.median(r["cpu_ms_per_scrape"] for r in group)
        median_cpu[(shape, n, subject)] = cpu
        runs = " ".join(f"{r['cpu_ms_per_scrape']:.2f}" for r in group)
        lines.append(f"  {shape:6} {n:6d} {subject:9} {cpu:6.2f} ms  (runs: {runs})  "
                     f"p50 {statistics.median(r['p50_ms'] for r in group):7.1f} ms  "
                     f"p99 {statistics.median(r['p99_ms'] for r in group):7.1f} ms  "
                     f"failed {sum(r['failed'] for r in group)}  "
                     f"RSS {max(r['max_rss_mb'] for r in group):5.1f} MB  "
                     f"fleet {statistics.median(r['fleet_cpu_ms_per_scrape'] for r in group):.2f} ms")
    for (shape, n, subject), cpu in sorted(median_cpu.items()):
        base = median_cpu.get((shape, n, BLACKBOX))
        if subject != BLACKBOX and base:
            lines.append(f"  {shape:6} {n:6d} {subject} / blackbox_exporter: {cpu / base:.2f}x")
        evloop = median_cpu.get((shape, n, "evloop"))
        if subject == "uvloop" and evloop:
            lines.append(f"  {shape:6} {n:6d} uvloop / evloop: {cpu / evloop:.2f}x")
    return "\n".join(lines)


def start(subject: str, workdir: Path, args):
    if subject == BLACKBOX:
        return Blackbox(workdir)
    return Exporter(workdir, args.config, args.exporter_ref, loop=subject)


async def main_async(args) -> list[dict]:
    rows = []
    subjects = list(args.loops) + ([BLACKBOX] if args.blackbox else [])
    print(HEADER, flush=True)
    for n in sorted(set(args.backends) | set(args.burst)):
        fleet = Fleet(n, static=args.static_fleet)
        try:
            for repeat in range(args.repeat):
                shift = (repeat + args.shift) % len(subjects)
                for subject in subjects[shift:] + subjects[:shift]:
                    with tempfile.TemporaryDirectory(prefix="hangwatch-bench-") as workdir:
                        process = start(subject, Path(workdir), args)
                        try:
                            if n in args.backends:
                                rows.append(await run_spread(subject, process.port, process.pid, fleet,
                                                             args.interval, args.rounds, repeat))
                                print(show(rows[-1]), flush=True)
                            if n in args.burst:
                                rows.append(await run_burst(subject, process.port, process.pid, fleet, repeat))
                                print(show(rows[-1]), flush=True)
                        finally:
                            process.stop()
        finally:
            fleet.stop()
    return rows


def sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip() and int(part) > 0]  # 0: none


def loops(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    for name in chosen:
        if name not in ("evloop", "uvloop"):
            raise argparse.ArgumentTypeError(f"{name!r}: a loop is evloop or uvloop")
    return chosen


def parse_seconds(text: str) -> float:
    return float(text[:-1]) if text.endswith("s") else float(text)


def _exit_on_sigterm() -> None:
    """SIGTERM (a timeout, Ctrl-C's cousin) runs the finally blocks that stop every process."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the exporter under many backends, beside blackbox_exporter")
    parser.add_argument("--backends", type=sizes, default=[1000], help="spread runs (comma list; default 1000)")
    parser.add_argument("--burst", type=sizes, default=[1000], help="burst runs (comma list; default 1000)")
    parser.add_argument("--interval", type=parse_seconds, default=15.0, help="scrape interval (default 15s)")
    parser.add_argument("--rounds", type=int, default=1, help="measured intervals after one warm-up (default 1)")
    parser.add_argument("--loops", type=loops, default=["evloop"], help="hangwatch on these loops: evloop,uvloop")
    parser.add_argument("--no-blackbox", dest="blackbox", action="store_false",
                        help="skip blackbox_exporter (it runs by default)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every subject, interleaved (default 1)")
    parser.add_argument("--shift", type=int, default=0,
                        help="start the subjects' rotation here (runs split over several invocations)")
    parser.add_argument("--static-fleet", action="store_true", help="the old fleet: one write, a static page")
    parser.add_argument("--exporter-ref", default=None, help="run this git commit's exporter (before numbers)")
    parser.add_argument("--config", default="", help="exporter config YAML text")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="print the medians of these runs' rows")
    args = parser.parse_args(argv)
    if args.summarize:
        rows = [row for name in args.summarize for row in json.loads(Path(name).read_text())]
        print(medians(rows))
        return 0
    raise_fd_limit()
    _exit_on_sigterm()
    print(f"exporter: {args.exporter_ref or 'this tree'}; loops {','.join(args.loops)}; blackbox_exporter "
          f"{'yes' if args.blackbox else 'no'}; fleet {'static, one write' if args.static_fleet else 'moving page, head and body apart'}; "
          f"interval {args.interval:g}s, timeout {TIMEOUT:g}s, load before: {loadavg()}", flush=True)
    rows = asyncio.run(main_async(args))
    print(medians(rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
