"""`stalled`: requests in flight for a whole stall window and no output, while something else moves.

The reading side (what counts as output per engine: aborted and failed vLLM requests do not),
the verdict (only with a window; deferred-only waiting is exempt from hung but not from
stalled), and `hangwatch check --stall-window` against the simulator (exit 3, `--liveness`
alive unless `--stalled-is-hung`). The truth-table rows (tests/scenarios/stalled_*.yaml) test
the same verdict against the rules.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hangwatch.check import check
from hangwatch.observation import Observation
from hangwatch.reading import Reading, parse
from hangwatch.simulator import Simulator
from hangwatch.verdict import judge
from tests.test_engines import sglang_page, tgi_page

DATA = Path(__file__).parent / "data"


def vllm_page(finished: dict[str, float], generation: float = 100.0) -> str:
    """The captured busy vLLM page with its request_success samples and generation tokens replaced."""
    lines = []
    for line in (DATA / "vllm-0.32" / "busy.prom").read_text().splitlines():
        if line.startswith("vllm:request_success_total{"):
            reason = line.split('finished_reason="', 1)[1].split('"', 1)[0]
            line = line.rsplit(" ", 1)[0] + f" {finished.get(reason, 0.0)}"
        elif line.startswith("vllm:generation_tokens_total{"):
            line = line.rsplit(" ", 1)[0] + f" {generation}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_aborted_and_failed_vllm_requests_are_not_output():
    reading = parse(vllm_page({"stop": 2, "length": 3, "abort": 40, "error": 5, "repetition": 1}))
    assert reading.finished == 51          # engine work: every finished request
    assert reading.served == 6             # answered: stop, length, repetition
    assert reading.output() == 100 + 6
    more_aborts = parse(vllm_page({"stop": 2, "length": 3, "abort": 90, "error": 9, "repetition": 1}))
    assert more_aborts.output() == reading.output()


def test_each_engines_output_signal():
    tgi = parse(tgi_page(prefill=10, decode=900, success=30))
    assert (tgi.decodes, tgi.output()) == (900, 930)
    prefill_only = parse(tgi_page(prefill=99, decode=900, success=30))
    assert prefill_only.output() == tgi.output()  # prefill calls are no output
    assert parse(sglang_page(gen=20000, finished=40)).output() == 20000  # num_requests counts aborts too
    llama = parse((DATA / "llamacpp" / "busy-4-slots-2-deferred.prom").read_text())
    assert llama.output() == llama.generation_tokens


def reading(out_tokens: float, *, prompt: float = 0.0, running: float = 2, waiting: float = 0,
            deferred: float | None = None, aborted_free: float = 0.0) -> Reading:
    return Reading(engine="vllm", running=running, waiting=waiting, deferred=deferred, steps=10 + prompt,
                   prompt_tokens=prompt, generation_tokens=out_tokens, finished=aborted_free, served=0.0,
                   kv_cache_usage=0.5, process_start=1.0)


def series(readings, every: float = 15.0):
    return [Observation(i * every, "ok", reading=r) for i, r in enumerate(readings)]


def test_decode_dead_prefill_alive_is_stalled_only_with_a_window():
    # prompt tokens rise and aborts finish requests (engine work: never hung), no token comes out
    readings = [reading(500, prompt=1000 * i, aborted_free=3 * i) for i in range(22)]  # 315 s
    observations = series(readings)
    assert judge(observations).state == "busy"
    verdict = judge(observations, stall_window=300)
    assert verdict.state == "stalled" and verdict.exit_code == 3, verdict.reason
    assert judge(observations[:20], stall_window=300).state == "busy"  # 285 s: watching
    assert not judge(observations[:20], stall_window=300).settled


def test_output_moving_is_busy_and_settled():
    observations = series([reading(500 + i, prompt=1000 * i) for i in range(3)])
    verdict = judge(observations, stall_window=300)
    assert (verdict.state, verdict.settled) == ("busy", True), verdict.reason


def test_deferred_only_waiting_is_never_hung_but_is_stalled_after_the_window():
    readings = [reading(500, running=0, waiting=3, deferred=3) for _ in range(22)]
    observations = series(readings)
    assert judge(observations).state == "busy"
    assert judge(observations, stall_window=300).state == "stalled"


def test_nothing_in_flight_for_a_moment_restarts_the_stall():
    readings = ([reading(500, prompt=i) for i in range(10)] + [reading(500, prompt=10, running=0)]
                + [reading(500, prompt=11 + i) for i in range(11)])
    observations = series(readings)
    assert judge(observations, stall_window=300).state == "busy"
    assert judge(observations, stall_window=150).state == "stalled"


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.stop()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hangwatch", "check", *args], capture_output=True, text=True,
                          timeout=120)


def test_check_with_a_stall_window_exits_3_on_a_prefill_that_outlasts_it(sim):
    # The simulator's long prefill moves KV only: engine work, no output. Longer than the window,
    # it is what a decode-dead engine looks like to a check with a 1.5 s window.
    sim.set_state("long_prefill", prompt_tokens=10_000_000)
    assert sim.wait_for(lambda: sim.running == 1)
    plain = run_cli(sim.url, "--interval", "0.3", "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["verdict"] == "busy"
    stalled = run_cli(sim.url, "--interval", "0.3", "--stall-window", "1500ms", "--json")
    body = json.loads(stalled.stdout)
    assert stalled.returncode == 3 and body["verdict"] == "stalled", stalled.stdout + stalled.stderr
    assert body["exit_code"] == 3 and body["readings"] >= 6 and body["probe_sent"] is False
    live = run_cli(sim.url, "--interval", "0.3", "--timeout", "1", "--stall-window", "1500ms", "--liveness")
    assert live.returncode == 0, live.stdout
    dead = run_cli(sim.url, "--interval", "0.3", "--timeout", "1", "--stall-window", "1500ms", "--liveness",
                   "--stalled-is-hung")
    assert dead.returncode == 1 and "stalled" in dead.stdout, dead.stdout


def test_check_with_a_stall_window_says_busy_while_tokens_come_out(sim):
    sim.set_state("busy", n=3)
    assert sim.wait_for(lambda: sim.running == 3)
    result = check(sim.url, interval=0.3, timeout=2.0, stall_window=30.0)
    assert (result.verdict.state, result.exit_code) == ("busy", 0), result.verdict.reason
    assert len(result.observations) <= 3  # output moved: settled, not read for the whole window


def test_stalled_is_hung_needs_liveness_and_a_window():
    result = run_cli("http://127.0.0.1:9", "--stalled-is-hung")
    assert result.returncode == 64 and "--stalled-is-hung" in result.stderr


def test_rules_take_each_engines_window_and_the_flag_overrides_one(tmp_path):
    from hangwatch.cli import main
    assert main(["rules", "--out", str(tmp_path / "default")]) == 0
    default = (tmp_path / "default" / "hangwatch-recording.yml").read_text()
    assert 'hangwatch_backend_info{engine=~"vllm|tgi"}) * 300' in default
    assert 'hangwatch_backend_info{engine=~"llamacpp|sglang"}) * 1800' in default
    assert main(["rules", "--out", str(tmp_path / "mine"), "--stall-window", "vllm=10m"]) == 0
    mine = (tmp_path / "mine" / "hangwatch-recording.yml").read_text()
    assert 'hangwatch_backend_info{engine="vllm"}) * 600' in mine and 'engine="tgi"}) * 300' in mine


@pytest.mark.parametrize("flag", ["nosuch=5m", "vllm=5", "1s"])
def test_a_bad_rules_stall_window_is_usage_exit_64(tmp_path, flag):
    result = subprocess.run([sys.executable, "-m", "hangwatch", "rules", "--out", str(tmp_path),
                             "--stall-window", flag], capture_output=True, text=True, timeout=60)
    assert result.returncode == 64 and "--stall-window" in result.stderr, result.stderr


def test_a_targets_own_stall_window_is_exported_for_that_target_only():
    from hangwatch.exporter.collector import render_series, series_for
    from hangwatch.exporter.config import ConfigError as ExporterConfigError
    from hangwatch.exporter.config import exporter_config
    config = exporter_config({"targets": [{"url": "http://127.0.0.1:8000", "stall_window": "90s"}]})
    assert config.options_for("http://127.0.0.1:8000").stall_window == 90
    assert config.options_for("http://127.0.0.1:8001").stall_window is None
    reading = parse((DATA / "vllm-0.32" / "busy.prom").read_text())
    observation = Observation(0.0, "ok", reading=reading)
    own = render_series(series_for(observation, "backend", 0.01, stall_window=90)).decode()
    assert "hangwatch_stall_window_seconds 90.0" in own
    assert f"hangwatch_engine_output_total {reading.output()}" in own
    assert "hangwatch_stall_window_seconds" not in render_series(series_for(observation, "backend", 0.01)).decode()
    with pytest.raises(ExporterConfigError, match=r"targets\[0\]\.stall_window"):
        exporter_config({"targets": [{"url": "http://127.0.0.1:8000", "stall_window": 90}]})
