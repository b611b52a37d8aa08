"""A scrape more than half an interval late does not break a hung server's hang in two.

Prometheus scrapes late when it or the machine is loaded (measured in this project's CI: two
scrapes of a 3 s job 1.1 s apart while vLLM held both cores). A late scrape followed by an
on-time one puts two readings less than half an interval apart, and for a while the range that
should hold the last three readings holds four. Rules that asked for exactly three readings
found none for an evaluation or two: a frozen server read busy in between and its hang alert
fired twice. The rules now read the last three and one older reading then, which keeps a
frozen server hung and a working one busy (rules/windows.py ``readings_windows``). The scenarios'
own jitter (tests/rules/gen_promtool.py) stays under half an interval, so this is its own test.
"""
from __future__ import annotations

import subprocess

import yaml

from hangwatch.observation import Observation
from hangwatch.reading import Reading
from hangwatch.rules.render import Settings
from tests.support.require import require_binary

from .gen_promtool import _number, _values, rule_files
from .observations import exported_samples, series_name

SCRAPE = 15.0
STEP = 0.1                       # input resolution, seconds
READINGS = 16
LATE = {7: 9.0, 12: 8.0}         # reading -> seconds late (more than half of 15 s); the next is on time
STATE = "target:hangwatch_backend_state:current"


def reading_times() -> list[float]:
    return [SCRAPE * i + 1.0 + LATE.get(i, 0.0) for i in range(READINGS)]


def labels(target: str) -> dict:
    return {"job": "hangwatch", "instance": f"http://{target}:8000", "target": target, "container": target}


def reading(target: str, index: int) -> Reading:
    """``frozen``: four requests in flight and nothing moves; ``working``: one step per reading."""
    steps = 100.0 if target == "frozen" else 100.0 + index
    return Reading(engine="vllm", running=4.0, waiting=0.0, steps=steps, prompt_tokens=50.0,
                   generation_tokens=steps * 2, prefix_cache_queries=50.0, finished=3.0, kv_cache_usage=0.25,
                   process_start=1_700_000_000.0)


def input_series() -> list[dict]:
    points: dict[str, dict[int, str]] = {}
    for target in ("frozen", "working"):
        for index, at in enumerate(reading_times()):
            observation = Observation(at, "ok", reading=reading(target, index))
            for name, value in exported_samples(observation, "backend", labels(target)).items():
                points.setdefault(name, {})[round(at / STEP)] = _number(value)
    last = max(max(p) for p in points.values())
    return [{"series": name, "values": _values(p, last)} for name, p in sorted(points.items())]


def state(target: str, name: str, value: int) -> dict:
    return {"labels": series_name(STATE, {**labels(target), "state": name}), "value": value}


def test_a_late_scrape_keeps_a_frozen_server_hung_and_a_working_one_busy(tmp_path):
    times = reading_times()
    assert any(b - a < SCRAPE / 2 for a, b in zip(times, times[1:]))  # the case under test is in the input
    checks = []
    # Hung from the third reading on (16 s + 2 intervals); checked at every evaluation after it.
    for t in range(48, int(times[-1]) + 3, 3):
        checks.append({"expr": f'{STATE}{{state="hung"}}', "eval_time": f"{t}s",
                       "exp_samples": [state("frozen", "hung", 1), state("working", "hung", 0)]})
        checks.append({"expr": f'{STATE}{{state="busy"}}', "eval_time": f"{t}s",
                       "exp_samples": [state("frozen", "busy", 0), state("working", "busy", 1)]})
    rules = rule_files(tmp_path / "rules", Settings(scrape_interval=SCRAPE))
    test = {"rule_files": [str(path) for path in rules], "evaluation_interval": "3s",
            "group_eval_order": ["hangwatch-recording", "hangwatch-alerts"],
            "tests": [{"interval": f"{round(STEP * 1000)}ms", "input_series": input_series(),
                       "promql_expr_test": checks}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False, width=200))
    result = subprocess.run([require_binary("promtool"), "test", "rules", str(tmp_path / "test.yml")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
