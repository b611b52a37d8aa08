"""Benchmark: hangwatch's page normalizer vs prometheus_client's full text parse.

The normalizer runs for every backend at every scrape, so it must stay far cheaper than a full
parse (the goal: ≥ 5× faster, < 5 ms per page). Run: ``python bench/bench_reading.py``.
"""
from __future__ import annotations

import pathlib
import statistics
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hangwatch.reading import parse  # noqa: E402

PAGES = sorted((ROOT / "tests" / "data").glob("*/*.prom"))


def per_call(fn, arg, min_seconds=0.5) -> float:
    """Median seconds per call over several timed batches."""
    fn(arg)
    batch, times = 1, []
    while True:
        started = time.perf_counter()
        for _ in range(batch):
            fn(arg)
        elapsed = time.perf_counter() - started
        if elapsed > 0.05:
            break
        batch *= 2
    deadline = time.perf_counter() + min_seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        for _ in range(batch):
            fn(arg)
        times.append((time.perf_counter() - started) / batch)
    return statistics.median(times)


def full_parse(page: str):
    for _ in text_string_to_metric_families(page):
        pass


def main() -> int:
    if not PAGES:
        print("no captured pages under tests/data/*/*.prom", file=sys.stderr)
        return 1
    worst_ratio, worst_ms = float("inf"), 0.0
    print(f"{'page':42} {'bytes':>7} {'hangwatch':>11} {'full parse':>11} {'ratio':>7}")
    for path in PAGES:
        page = path.read_text()
        try:
            parse(page)
        except ValueError:
            continue  # pages that are deliberately unreadable
        ours, theirs = per_call(parse, page), per_call(full_parse, page)
        ratio = theirs / ours
        worst_ratio, worst_ms = min(worst_ratio, ratio), max(worst_ms, ours * 1000)
        name = f"{path.parent.name}/{path.name}"
        print(f"{name:42} {len(page):7d} {ours * 1000:9.3f}ms {theirs * 1000:9.3f}ms {ratio:6.1f}x")
    ok = worst_ratio >= 5 and worst_ms < 5
    print(f"worst: {worst_ms:.3f} ms per page, {worst_ratio:.1f}x faster than a full parse "
          f"(goal ≥ 5x and < 5 ms): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
