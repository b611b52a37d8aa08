#!/usr/bin/env python3
"""How long from an engine freeze to the hang notification at the webhook?

    python bench/bench_alert_latency.py [--runs 3] [--scrape-interval 1s]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hangwatch.demo.wait import wait_until  # noqa: E402
from hangwatch.rules.render import Settings, parse_interval, readings_windows, rule_groups  # noqa: E402
from harness.stack import Stack  # noqa: E402


def shipped_windows(scrape_interval: float) -> dict[str, float]:
    """The hang-path durations of the rules rendered for ``scrape_interval`` (seconds)."""
    groups = {name: rule_groups(name, Settings(scrape_interval=scrape_interval))
              for name in ("hangwatch-recording.yml", "hangwatch-alerts.yml")}
    hung_rule = next(rule for rule in groups["hangwatch-alerts.yml"][0]["rules"]
                     if rule.get("alert") == "HangwatchBackendHung")
    return {
        "scrape": scrape_interval,
        # the hang needs three readings in a row (two intervals between the first and third)
        "window": readings_windows(3, scrape_interval)[0] + scrape_interval / 2,
        "recording_interval": parse_interval(groups["hangwatch-recording.yml"][0]["interval"]),
        "alert_interval": parse_interval(groups["hangwatch-alerts.yml"][0]["interval"]),
        "for": parse_interval(hung_rule["for"]),
    }


def computed_latency(w: dict[str, float]) -> tuple[float, float]:
    """(typical, worst) seconds from the last engine progress to the alert firing."""
    # The window holds three readings; the last progress is up to one scrape before the first.
    stall = w["window"] - w["scrape"]          # two intervals between the first and third frozen reading
    worst = w["scrape"] + stall + w["recording_interval"] + w["alert_interval"] + w["for"]
    typical = w["scrape"] / 2 + stall + w["recording_interval"] / 2 + w["alert_interval"] / 2 + w["for"]
    return typical, worst


def measure_once(scrape_interval: float) -> float:
    with tempfile.TemporaryDirectory(prefix="hangwatch-bench-") as workdir:
        stack = Stack(Path(workdir), scrape_interval=scrape_interval).start()
        try:
            stack.sim.set_state("busy", n=3)
            stack.wait_state("busy", timeout=30)
            if stack.receiver.alerts("/alerts", "HangwatchBackendHung") or stack.ever("hung", 60):
                causes = stack.query("max_over_time(target:hangwatch_backend_hung:cause[60s]) > 0")
                raise RuntimeError(f"hung before the freeze (causes: {causes}); the machine is too loaded?")
            frozen_at = time.time()
            stack.sim.set_state("frozen")
            wait_until(lambda: stack.receiver.alerts("/alerts", "HangwatchBackendHung"), 60 * scrape_interval + 30,
                       "the hang notification")
            return stack.receiver.alerts("/alerts", "HangwatchBackendHung")[0][0] - frozen_at
        finally:
            stack.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="freeze → hang notification latency")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scrape-interval", default="1s", help="the test scrape interval (default 1s)")
    args = parser.parse_args(argv)
    interval = parse_interval(args.scrape_interval)
    samples = [measure_once(interval) for _ in range(args.runs)]
    scale = 15.0 / interval
    print(f"measured, scrape {args.scrape_interval} (rules rendered for it, wall-clock durations x{interval / 15:g}), {args.runs} runs: "
          f"min {min(samples):.2f}s  median {statistics.median(samples):.2f}s  max {max(samples):.2f}s")
    test_typical, test_worst = computed_latency(shipped_windows(interval))
    print(f"computed for this test setting: typical {test_typical:.2f}s, worst {test_worst:.2f}s "
          f"(+ Alertmanager group_wait 0s and delivery)")
    for label, scrape in (("shipped defaults, scrape 15s", 15.0), ("documented fast setting, scrape 3s", 3.0)):
        w = shipped_windows(scrape)
        typical, worst = computed_latency(w)
        print(f"computed, {label}: window {w['window']:g}s, groups {w['recording_interval']:g}s, "
              f"for {w['for']:g}s -> typical {typical:.1f}s, worst {worst:.1f}s")
    print(f"measured scaled to a 15s scrape (x{scale:g}): median {statistics.median(samples) * scale:.1f}s, "
          f"max {max(samples) * scale:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
