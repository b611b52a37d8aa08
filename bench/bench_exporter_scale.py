#!/usr/bin/env python3
"""How many backends one exporter carries, and at what CPU beside blackbox_exporter's.

    python bench/bench_exporter_scale.py [--fleet busy,idle] [--backends 100,1000,5000] [--interval 15s]
        [--rounds 2] [--burst 100,1000,5000] [--loops uvloop,asyncio] [--no-blackbox]
        [--repeat N] [--shift K] [--static-fleet] [--exporter-ref COMMIT] [--json FILE]
    python bench/bench_exporter_scale.py --summarize run1.json run2.json ...   (bench/scalereport.py)

Two fleets: busy (requests in flight, counters moving: hangwatch reads /metrics and nothing
else) and idle (nothing in flight: hangwatch reads /metrics and sends its 1-token probe, where
blackbox_exporter POSTs the same completion — the naive probe it is compared to).

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from processes import (  # noqa: E402
    BLACKBOX_COMPLETION,
    BLACKBOX_MODULE,
    LOOPS,
    Blackbox,
    Exporter,
    Fleet,
    has_evloop,
    raise_fd_limit,
)
from procstat import loadavg, sample  # noqa: E402
from scalereport import BLACKBOX, HEADER, medians, show  # noqa: E402
from scrapeload import Result, Scraper, burst, spread  # noqa: E402

TIMEOUT = 10.0  # the example Prometheus config's scrape_timeout
FLEETS = ("busy", "idle")


def probe_paths(urls: list[str], subject: str, fleet: str = "busy") -> list[str]:
    """What each subject is asked per backend: blackbox reads /metrics of a busy backend and
    POSTs the 1-token completion to an idle one; hangwatch is asked the same way for both."""
    if subject == BLACKBOX and fleet == "idle":
        return [f"/probe?target={url}/v1/completions&module={BLACKBOX_COMPLETION}" for url in urls]
    if subject == BLACKBOX:
        return [f"/probe?target={url}/metrics&module={BLACKBOX_MODULE}" for url in urls]
    return [f"/probe?target={url}&module=backend" for url in urls]


def expected(subject: str, fleet: str = "busy") -> bytes:
    """A success: blackbox's probe succeeded; hangwatch read the backend (busy) and its idle
    probe answered (idle: the probe was sent and reached the fleet)."""
    # a sample's line, never its HELP line ("# HELP hangwatch_up 1 if the backend answered ...")
    if subject == BLACKBOX:
        return b"\nprobe_success 1"
    return b"\nhangwatch_probe_success 1" if fleet == "idle" else b"\nhangwatch_up 1"


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
            repeat: int, fleet: str = "busy") -> dict:
    """``marks``: [(monotonic, subject's sample, fleet's sample, fleet's request counts)] at the
    window's start and end."""
    now = sample(pid)
    row = {
        "fleet": fleet, "subject": subject, "repeat": repeat,
        "shape": shape, "backends": n, "scrapes": result.started, "failed": result.failed,
        "failures": result.failures, "p50_ms": result.quantile(0.5) * 1000,
        "p99_ms": result.quantile(0.99) * 1000,
        "max_ms": (max(result.latencies) * 1000) if result.latencies else float("nan"),
        "rss_mb": now.rss / 2**20, "peak_rss_mb": now.peak_rss / 2**20, "max_rss_mb": watch.max_rss / 2**20,
        "max_threads": watch.max_threads, "max_fds": watch.max_fds, "load": loadavg(),
    }
    (t0, s0, f0, q0), (t1, s1, f1, q1) = marks
    cpu, seconds, scrapes = s1.cpu - s0.cpu, t1 - t0, max(1, result.started)
    row["cpu_ms_per_scrape"] = cpu / scrapes * 1000
    row["core_percent"] = cpu / seconds * 100
    row["seconds"] = seconds
    row["system_share"] = (s1.system - s0.system) / cpu if cpu else float("nan")  # the kernel's part
    row["fleet_cpu_ms_per_scrape"] = (f1.cpu - f0.cpu) / scrapes * 1000
    # what the subject asked of the fleet per scrape, counted where it arrived
    row["fleet_requests_per_scrape"] = (q1["requests"] - q0["requests"]) / scrapes
    row["fleet_paths_per_scrape"] = {path: (count - q0["paths"].get(path, 0)) / scrapes
                                     for path, count in sorted(q1["paths"].items())
                                     if count != q0["paths"].get(path, 0)}
    return row


def _mark(pid: int, fleet: Fleet) -> tuple:
    return time.monotonic(), sample(pid), sample(fleet.pid), fleet.stats()


async def run_spread(subject: str, port: int, pid: int, fleet: Fleet, interval: float, rounds: int,
                     repeat: int) -> dict:
    scraper = Scraper("127.0.0.1", port, TIMEOUT, expect=expected(subject, fleet.kind))
    watch = Watch(pid)
    watcher = asyncio.create_task(watch.run())
    marks = []
    result = await spread(scraper, probe_paths(fleet.urls(), subject, fleet.kind), interval, rounds,
                          on_window=lambda: marks.append(_mark(pid, fleet)))
    watcher.cancel()
    scraper.close()
    return summary(subject, "spread", len(fleet.urls()), result, marks, watch, pid, repeat, fleet.kind)


async def run_burst(subject: str, port: int, pid: int, fleet: Fleet, repeat: int) -> dict:
    scraper = Scraper("127.0.0.1", port, TIMEOUT, expect=expected(subject, fleet.kind))
    watch = Watch(pid)
    watcher = asyncio.create_task(watch.run())
    marks = [_mark(pid, fleet)]
    result = await burst(scraper, probe_paths(fleet.urls(), subject, fleet.kind))
    marks.append(_mark(pid, fleet))
    watcher.cancel()
    scraper.close()
    return summary(subject, "burst", len(fleet.urls()), result, marks, watch, pid, repeat, fleet.kind)


def start(subject: str, workdir: Path, args):
    if subject == BLACKBOX:
        return Blackbox(workdir)
    loop, _, ref = subject.partition("@")  # "uvloop@REF": that commit's exporter beside this tree's
    return Exporter(workdir, args.config, ref or args.exporter_ref, loop=loop)


async def main_async(args) -> list[dict]:
    """Every fleet kind and size starts once and stays up; each repeat runs every subject on
    every fleet, the subjects' order rotating with the repeat."""
    rows = []
    subjects = list(args.loops) + ([BLACKBOX] if args.blackbox else [])
    print(HEADER, flush=True)
    fleets = []
    try:
        for kind in args.fleet:
            for n in sorted(set(args.backends) | set(args.burst)):
                fleets.append(Fleet(n, static=args.static_fleet, kind=kind))
        for repeat in range(args.repeat):
            for fleet in fleets:
                n = len(fleet.ports)
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
        for fleet in fleets:
            fleet.stop()
    return rows


def sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip() and int(part) > 0]  # 0: none


def loops(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    for name in chosen:
        if name.partition("@")[0] not in LOOPS:
            raise argparse.ArgumentTypeError(f"{name!r}: a loop is one of {', '.join(LOOPS)}, "
                                             "optionally @REF (that commit's exporter)")
    return chosen


def fleets(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    for name in chosen:
        if name not in FLEETS:
            raise argparse.ArgumentTypeError(f"{name!r}: a fleet is busy or idle")
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
    parser.add_argument("--fleet", type=fleets, default=list(FLEETS), help="fleets: busy,idle (default both)")
    parser.add_argument("--loops", type=loops, default=None,
                        help="hangwatch on these loops: asyncio,uvloop (HANGWATCH_LOOP); evloop,uvloop for an "
                             "exporter from before issue 34 (default: the exporter's own loop); LOOP@REF runs commit "
                             "REF's exporter beside this tree's, interleaved (an A/B in one run)")
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
    evloop_tree = has_evloop(args.exporter_ref)
    if args.loops is None:
        args.loops = ["evloop" if evloop_tree else "uvloop"]
    wrong = [name for name in args.loops if "@" not in name and (name == "evloop") != evloop_tree and name != "uvloop"]
    if wrong:
        parser.error(f"--loops {','.join(wrong)}: this exporter's loops are "
                     f"{'evloop and uvloop' if evloop_tree else 'asyncio and uvloop'}")
    raise_fd_limit()
    _exit_on_sigterm()
    print(f"exporter: {args.exporter_ref or 'this tree'}; fleets {','.join(args.fleet)}; loops {','.join(args.loops)}; blackbox_exporter "
          f"{'yes' if args.blackbox else 'no'}; fleet {'static, one write' if args.static_fleet else 'moving page, head and body apart'}; "
          f"interval {args.interval:g}s, timeout {TIMEOUT:g}s, load before: {loadavg()}", flush=True)
    rows = asyncio.run(main_async(args))
    print(medians(rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
