#!/usr/bin/env python3
"""A real Prometheus scraping 1,000 backends through one exporter, with the shipped rules.

    python bench/bench_exporter_prometheus.py [--backends 1000] [--minutes 3] [--exporter-ref COMMIT] [--rules DIR] [--top-rules N]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from processes import Exporter, Fleet, raise_fd_limit  # noqa: E402
from procstat import loadavg, sample  # noqa: E402

from hangwatch.demo.processes import Process  # noqa: E402
from harness.ports import free_port  # noqa: E402

RULES = sorted((ROOT / "rules").glob("*.yml"))
TOP_RULES = 6  # per group, the rules printed with their evaluation times (--top-rules)


def rule_name(rule: dict) -> str:
    """A rule as a person finds it in the file: its record or alert name, and the labels it sets."""
    labels = ",".join(f"{k}={v}" for k, v in rule.get("labels", {}).items() if k not in ("severity", "action"))
    return rule["name"] + (f"{{{labels}}}" if labels else "")


def watch_rules(base: str, seconds: float) -> dict[tuple[str, str], list[float]]:
    """Sleep ``seconds``, reading /api/v1/rules every 2 s: each rule's evaluation times, one per
    evaluation (an evaluation read twice is counted once, by its timestamp)."""
    times: dict[tuple[str, str], dict[str, float]] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        groups = requests.get(f"{base}/api/v1/rules", timeout=30).json()["data"]["groups"]
        for group in groups:
            for rule in group["rules"]:
                if rule.get("lastEvaluation", "").startswith("0001-"):
                    continue  # not evaluated yet
                key = (group["name"], rule_name(rule))
                times.setdefault(key, {})[rule["lastEvaluation"]] = rule["evaluationTime"]
    return {key: list(by_time.values()) for key, by_time in times.items()}


def print_rule_times(times: dict[tuple[str, str], list[float]], top: int = TOP_RULES) -> None:
    """Per group, the costliest rules by median evaluation time (a group's rules run one after another)."""
    for group in sorted({group for group, _ in times}):
        rules = [(statistics.median(v), max(v), len(v), name) for (g, name), v in times.items() if g == group]
        total = sum(median for median, *_ in rules)
        print(f"  {group}: sum of rule medians {total * 1000:.1f} ms; costliest:")
        for median, worst, count, name in sorted(rules, reverse=True)[:top]:
            print(f"    {median * 1000:7.1f} ms median, {worst * 1000:7.1f} ms slowest ({count} evaluations)  {name}")


def prometheus_config(workdir: Path, exporter_port: int, prom_port: int, sd_file: Path,
                      rules: list[Path] = RULES) -> dict:
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {"job_name": "hangwatch", "metrics_path": "/probe", "scrape_interval": "15s", "scrape_timeout": "10s",
             "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1m"}],
             "relabel_configs": [
                 {"source_labels": ["__param_module"], "regex": "", "target_label": "__param_module",
                  "replacement": "backend"},
                 {"source_labels": ["__address__"], "target_label": "__param_target"},
                 {"source_labels": ["__param_target"], "target_label": "instance"},
                 {"target_label": "__address__", "replacement": f"127.0.0.1:{exporter_port}"}]},
            {"job_name": "hangwatch_exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
            {"job_name": "prometheus", "scrape_interval": "5s",
             "static_configs": [{"targets": [f"127.0.0.1:{prom_port}"]}]},
        ],
    }


def _exit_on_sigterm() -> None:
    """SIGTERM (a timeout, Ctrl-C's cousin) runs the finally blocks that stop every process."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="real Prometheus, 1,000 backends, one exporter")
    parser.add_argument("--backends", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--exporter-ref", default=None)
    parser.add_argument("--top-rules", type=int, default=TOP_RULES, metavar="N",
                        help="rules printed per group, costliest first")
    parser.add_argument("--rules", type=Path, default=None, metavar="DIR",
                        help="the rule files to evaluate (default: this tree's rules/*.yml)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    _exit_on_sigterm()
    rules = sorted(args.rules.glob("*.yml")) if args.rules else RULES
    print(f"exporter: {args.exporter_ref or 'this tree'}; rules: {args.rules or 'this tree'}; "
          f"{args.backends} backends, {args.minutes:g} min; "
          f"load before: {loadavg()}", flush=True)
    # The static page (bench/fleet.py --static): nothing moves, so every target reads hung and
    # 1,000 restart alerts fire, the worst case for the alert group (and comparable runs).
    fleet = Fleet(args.backends, static=True)
    processes: list[Process] = []
    with tempfile.TemporaryDirectory(prefix="hangwatch-bench-prom-") as tmp:
        workdir = Path(tmp)
        exporter = Exporter(workdir, "", args.exporter_ref)
        try:
            sd_file = workdir / "targets.yml"
            sd_file.write_text(yaml.safe_dump([
                {"targets": [url], "labels": {"target": f"b{i:04d}"}} for i, url in enumerate(fleet.urls())]))
            port = free_port()  # Prometheus scrapes itself, so its port is in its config
            config = workdir / "prometheus.yml"
            config.write_text(yaml.safe_dump(prometheus_config(workdir, exporter.port, port, sd_file, rules), sort_keys=False))
            prom = Process("prometheus", [
                shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'prom-data'}", f"--web.listen-address=127.0.0.1:{port}"],
                workdir / "prometheus.log", port=port).start()
            processes.append(prom)
            prom.wait_ready("/-/ready")
            base = f"http://127.0.0.1:{port}"
            started, cpu0 = time.monotonic(), sample(exporter.pid).cpu
            prom_cpu0 = sample(prom.popen.pid).cpu
            rule_times = watch_rules(base, args.minutes * 60)
            elapsed, cpu1 = time.monotonic() - started, sample(exporter.pid).cpu
            prom_cpu1 = sample(prom.popen.pid).cpu
            window = f"{int(args.minutes * 60)}s"

            def query(expr: str):
                answer = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=30).json()
                return answer["data"]["result"]

            def value(expr: str) -> float:
                result = query(expr)
                return float(result[0]["value"][1]) if result else float("nan")

            scrapes = value(f'sum(count_over_time(up{{job="hangwatch"}}[{window}]))')
            # In one query: two queries a moment apart see different windows (a "-7 failed" once).
            failed = value(f'sum(count_over_time(up{{job="hangwatch"}}[{window}]) - sum_over_time(up{{job="hangwatch"}}[{window}]))')
            succeeded = scrapes - failed
            targets = value('count(up{job="hangwatch"})')
            up_backends = value("count(hangwatch_up == 1)")
            p99 = value(f'quantile(0.99, max_over_time(scrape_duration_seconds{{job="hangwatch"}}[{window}]))')
            p50 = value(f'quantile(0.5, avg_over_time(scrape_duration_seconds{{job="hangwatch"}}[{window}]))')
            worst = value(f'max(max_over_time(scrape_duration_seconds{{job="hangwatch"}}[{window}]))')
            print(f"targets {targets:.0f}, scrapes {scrapes:.0f}, failed {failed:.0f}; "
                  f"hangwatch_up 1: {up_backends:.0f}; scrape duration p50 {p50 * 1000:.1f} ms, "
                  f"p99 of per-target max {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
            for series in query(f"max_over_time(prometheus_rule_group_last_duration_seconds[{window}])"):
                group = series["metric"].get("rule_group", "?").split(";")[-1]
                selector = f'{{rule_group=~".*{group}"}}'
                missed = value(f"max(prometheus_rule_group_iterations_missed_total{selector})")
                interval = value(f"max(prometheus_rule_group_interval_seconds{selector})")
                typical = value(f"quantile_over_time(0.5, prometheus_rule_group_last_duration_seconds{selector}[{window}])")
                print(f"rule group {group:28} interval {interval:g}s: evaluation median {typical * 1000:7.1f} ms, "
                      f"slowest {float(series['value'][1]) * 1000:7.1f} ms, missed iterations {missed:.0f}")
            print_rule_times(rule_times, args.top_rules)
            now = sample(exporter.pid)
            per_scrape = (cpu1 - cpu0) / max(1.0, succeeded) * 1000
            print(f"exporter: {(cpu1 - cpu0) / elapsed * 100:.1f}% of a core, {per_scrape:.2f} ms CPU per scrape "
                  f"(incl. its own /metrics), RSS {now.rss / 2**20:.1f} MB (peak {now.peak_rss / 2**20:.1f}); "
                  f"Prometheus {(prom_cpu1 - prom_cpu0) / elapsed * 100:.1f}% of a core; load {loadavg()}")
            ok = targets == args.backends and failed == 0
            return 0 if ok else 1
        finally:
            for process in reversed(processes):
                process.stop()
            exporter.stop()
            fleet.stop()


if __name__ == "__main__":
    raise SystemExit(main())
