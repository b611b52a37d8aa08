#!/usr/bin/env python3
"""The scale benchmark's rows as text: one line per run, and the medians over the repeats with
the ratios hangwatch / blackbox_exporter — the table a closing note quotes.

    python bench/scalereport.py run1.json [run2.json ...] [--markdown]

How it measures: bench/README.md (``bench_exporter_scale.py``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

BLACKBOX = "blackbox"


def fleet_of(row: dict) -> str:
    return row.get("fleet", "busy")  # rows from before issue 34 had the busy fleet only


def show(row: dict) -> str:
    failures = ", ".join(f"{k}: {v}" for k, v in row["failures"].items())
    return (f"{fleet_of(row):4} {row['subject']:9} {row['shape']:6} {row['backends']:6d} {row['scrapes']:7d} "
            f"{row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['max_ms']:8.1f} {row['failed']:6d}  "
            f"{row['cpu_ms_per_scrape']:6.2f} ms {row['core_percent']:5.1f}% {row.get('system_share', 0) * 100:3.0f}% "
            f"{row['fleet_cpu_ms_per_scrape']:6.2f} {row.get('fleet_requests_per_scrape', float('nan')):5.2f} "
            f"{row['rss_mb']:6.1f} {row['max_rss_mb']:6.1f} {row['max_threads']:5d} {row['max_fds']:5d}  "
            f"[{row['load']}] {failures}")


HEADER = (f"{'flt':4} {'subject':9} {'shape':6} {'backs':>6} {'scrapes':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'failed':>6}  {'CPU/scrape':>9} {'core':>6} {'sys':>4} {'fleet':>6} {'req':>5} "
          f"{'RSS':>6} {'maxRSS':>6} {'thrds':>5} {'fds':>5}  [load 1/5/15 min]")


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """(fleet, shape, backends, subject) -> that subject's repeats."""
    found: dict[tuple, list[dict]] = {}
    for row in rows:
        found.setdefault((fleet_of(row), row["shape"], row["backends"], row["subject"]), []).append(row)
    return found


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (fleet, shape, backends, subject): medians over the repeats, failures summed,
    memory, threads and descriptors at their largest, and the ratio to blackbox_exporter's CPU."""
    out = []
    for (fleet, shape, n, subject), group in sorted(groups(rows).items()):
        paths: dict[str, list[float]] = {}
        for row in group:
            for path, count in row.get("fleet_paths_per_scrape", {}).items():
                paths.setdefault(path, []).append(count)
        out.append({
            "fleet": fleet, "shape": shape, "backends": n, "subject": subject, "runs": len(group),
            "cpu_ms_per_scrape": statistics.median(r["cpu_ms_per_scrape"] for r in group),
            "cpu_runs": [r["cpu_ms_per_scrape"] for r in group],
            "p50_ms": statistics.median(r["p50_ms"] for r in group),
            "p99_ms": statistics.median(r["p99_ms"] for r in group),
            "failed": sum(r["failed"] for r in group), "scrapes": sum(r["scrapes"] for r in group),
            "failed_runs": sum(1 for r in group if r["failed"]),
            "max_rss_mb": max(max(r["max_rss_mb"], r.get("peak_rss_mb", 0.0)) for r in group),  # VmHWM too
            "max_threads": max(r["max_threads"] for r in group), "max_fds": max(r["max_fds"] for r in group),
            "fleet_cpu_ms_per_scrape": statistics.median(r["fleet_cpu_ms_per_scrape"] for r in group),
            "fleet_requests_per_scrape": statistics.median(r.get("fleet_requests_per_scrape", float("nan"))
                                                           for r in group),
            "fleet_paths_per_scrape": {path: statistics.median(counts) for path, counts in sorted(paths.items())},
        })
    blackbox = {(r["fleet"], r["shape"], r["backends"]): r["cpu_ms_per_scrape"] for r in out
                if r["subject"] == BLACKBOX}
    for row in out:
        base = blackbox.get((row["fleet"], row["shape"], row["backends"]))
        row["ratio_to_blackbox"] = row["cpu_ms_per_scrape"] / base if base and row["subject"] != BLACKBOX else None
    return out


def medians(rows: list[dict]) -> str:
    lines = ["", "medians over the repeats (CPU per scrape; p50 / p99 latency; failed; max RSS; the fleet's "
             "CPU and requests per scrape):"]
    for m in median_rows(rows):
        runs = " ".join(f"{cpu:.2f}" for cpu in m["cpu_runs"])
        ratio = f"  {m['ratio_to_blackbox']:.2f}x blackbox" if m["ratio_to_blackbox"] else ""
        lines.append(f"  {m['fleet']:4} {m['shape']:6} {m['backends']:6d} {m['subject']:9} "
                     f"{m['cpu_ms_per_scrape']:6.2f} ms  (runs: {runs}){ratio}  "
                     f"p50 {m['p50_ms']:7.1f} ms  p99 {m['p99_ms']:7.1f} ms  "
                     f"failed {m['failed']} ({m['failed_runs']}/{m['runs']} runs)  RSS {m['max_rss_mb']:5.1f} MB  "
                     f"thr {m['max_threads']}  fds {m['max_fds']}  fleet {m['fleet_cpu_ms_per_scrape']:.2f} ms, "
                     f"{m['fleet_requests_per_scrape']:.2f} req ({paths_text(m['fleet_paths_per_scrape'])})")
    return "\n".join(lines)


def paths_text(paths: dict[str, float]) -> str:
    return ", ".join(f"{path} {count:.2f}" for path, count in paths.items())


def markdown(rows: list[dict]) -> str:
    """The medians as a Markdown table (bench/RESULTS-exporter.md)."""
    lines = ["| fleet | shape | backends | subject | CPU ms/scrape (median) | ÷ blackbox | p50 ms | p99 ms "
             "| failed (runs) | peak RSS MB | threads | fds | requests to the backend per scrape |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for m in median_rows(rows):
        ratio = f"{m['ratio_to_blackbox']:.2f}×" if m["ratio_to_blackbox"] else "—"
        lines.append(f"| {m['fleet']} | {m['shape']} | {m['backends']} | {m['subject']} | "
                     f"{m['cpu_ms_per_scrape']:.2f} | {ratio} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | "
                     f"{m['failed']} ({m['failed_runs']}/{m['runs']}) | {m['max_rss_mb']:.1f} | {m['max_threads']} | "
                     f"{m['max_fds']} | {m['fleet_requests_per_scrape']:.2f}: {paths_text(m['fleet_paths_per_scrape'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the medians of bench_exporter_scale.py runs")
    parser.add_argument("json", nargs="+", help="rows written by bench_exporter_scale.py --json")
    parser.add_argument("--markdown", action="store_true", help="also print the Markdown table")
    args = parser.parse_args(argv)
    rows = [row for name in args.json for row in json.loads(Path(name).read_text())]
    print(medians(rows))
    if args.markdown:
        print()
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
