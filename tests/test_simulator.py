"""The vLLM simulator: its page has the shape of real vLLM 0.32 pages, and its states behave
the way a real vLLM does (busy moves, a long prefill moves only KV, a frozen engine moves
nothing, a restart resets, a dead server refuses, a stopped one never answers)."""
from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time

import pytest
import requests

from hangwatch.demo.processes import Process
from hangwatch.demo.wait import wait_until as support_wait_until
from hangwatch.simulator import CONTENT_TYPE_METRICS, Simulator, main  # noqa: F401
from tests.sim_fixtures import CAPTURES, sample, scrape, shape, vllm_lines, wait_until

# capture file -> (simulator state, state parameters, multiprocess)
CAPTURE_STATES = {
    "idle.prom": ("idle", {}, False),
    "busy.prom": ("busy", {"n": 4}, False),
    "prefill.prom": ("long_prefill", {"prompt_tokens": 30000}, False),
    "frozen.prom": ("frozen", {}, False),
    "multiprocess-start.prom": ("idle", {}, True),
}
PROM_CAPTURES = sorted(p.name for p in CAPTURES.glob("*.prom")) if CAPTURES.is_dir() else []


@pytest.fixture
def sim():
    s = Simulator(manual_clock=True).start()
    yield s
    s.stop()


@pytest.fixture
def live():
    s = Simulator(step_seconds=0.01).start()
    yield s
    s.stop()


def complete(sim, max_tokens=4, timeout=10, chat=False, **extra):
    if chat:
        body = {"model": sim.model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": max_tokens, **extra}
        return requests.post(sim.url + "/v1/chat/completions", json=body, timeout=timeout)
    body = {"model": sim.model, "prompt": "hello there", "max_tokens": max_tokens, **extra}
    return requests.post(sim.url + "/v1/completions", json=body, timeout=timeout)


def in_background(fn, *args, **kwargs):
    result = {}

    def run():
        try:
            result["value"] = fn(*args, **kwargs)
        except Exception as exc:       # noqa: BLE001 - reported to the test
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


# -- fidelity against real captures ----------------------------------------------------------
def test_real_captures_are_present():
    assert PROM_CAPTURES, f"no real vLLM 0.32 pages in {CAPTURES}: capture them (see its README)"


def _sim_page_for(capture: str) -> tuple[str, str]:
    state, params, multiprocess = CAPTURE_STATES.get(capture, ("idle", {}, "multiprocess" in capture))
    real = (CAPTURES / capture).read_text()
    s = Simulator(multiprocess=multiprocess, step_seconds=0.01).start()
    try:
        if not multiprocess and "http_requests_total{" in real:
            # the instrumentator's rows follow traffic: give the simulator the same kind
            requests.get(s.url + "/v1/models", timeout=5)
            assert complete(s, max_tokens=2).status_code == 200
        if state == "frozen":
            s.set_state("busy", n=2)
            wait_until(lambda: s.engine.hists.get("vllm:iteration_tokens_total"), what="a step")
        s.set_state(state, **params)
        wait_until(lambda: state in ("idle", "frozen") or s.running > 0, what=state)
        return real, scrape(s)
    finally:
        s.stop()


@pytest.mark.parametrize("capture", PROM_CAPTURES)
def test_page_has_the_real_families_and_types(capture):
    real, page = _sim_page_for(capture)
    want = {(name, t) for name, (t, _, _) in shape(real).items()}
    got = {(name, t) for name, (t, _, _) in shape(page).items()}
    assert sorted(want - got) == [], "families missing from the simulator"
    assert sorted(got - want) == [], "families the real page does not have"


@pytest.mark.parametrize("capture", PROM_CAPTURES)
def test_page_has_the_real_label_names(capture):
    real, page = _sim_page_for(capture)
    want, got = shape(real), shape(page)
    for name, (_, labels, _) in want.items():
        if name not in got:
            continue
        if labels and got[name][1]:
            assert got[name][1] == labels, name
        elif name.startswith("vllm:"):
            assert bool(got[name][1]) == bool(labels), f"{name}: samples present in one page only"


@pytest.mark.parametrize("capture", PROM_CAPTURES)
def test_histograms_have_the_real_buckets(capture):
    real, page = _sim_page_for(capture)
    want, got = shape(real), shape(page)
    for name, (mtype, _, les) in want.items():
        if mtype == "histogram" and les and name in got and got[name][2]:
            assert got[name][2] == les, name


@pytest.mark.parametrize("capture", PROM_CAPTURES)
def test_help_text_matches_the_real_page(capture):
    real, page = _sim_page_for(capture)
    real_help = {line for line in real.splitlines() if line.startswith("# HELP")}
    sim_help = {line for line in page.splitlines() if line.startswith("# HELP")}
    # a family whose rows follow traffic may be absent from one page's _created part
    assert sorted(h for h in real_help - sim_help if "_created " not in h) == []


def _structure(page: str) -> list[str]:
    """Every line with its value dropped and the model name unified."""
    page = re.sub(r'model_name="[^"]*"', 'model_name="M"', page)
    return [re.sub(r" \S+$", "", line) for line in page.splitlines()]


@pytest.mark.parametrize("capture", PROM_CAPTURES)
def test_page_lines_match_the_real_page_but_for_values(capture):
    """Same families, order, HELP, labels, rows and buckets, line for line."""
    real, page = _sim_page_for(capture)
    assert _structure(page) == _structure(real)


def _json_captures(kind: str) -> list:
    found = []
    for path in sorted(CAPTURES.glob("*.json")) if CAPTURES.is_dir() else []:
        try:
            obj = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("object") == kind:
            found.append(obj)
    return found


def _keys(obj, path=""):
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(f"{path}.{k}")
            out |= _keys(v, f"{path}.{k}")
    elif isinstance(obj, list) and obj:
        out |= _keys(obj[0], path + "[]")
    return out


# Chat completions are compared with the live real vLLM (tests/real/test_real_vllm_simulator_fidelity.py).
@pytest.mark.parametrize("kind", ["list", "text_completion"])
def test_json_bodies_have_the_real_keys(live, kind):
    real = _json_captures(kind)
    assert real, f"no captured {kind} body in {CAPTURES} (capture them: python3 -m tests.real.capture)"
    if kind == "list":
        got = requests.get(live.url + "/v1/models", timeout=5).json()
    else:
        got = complete(live, chat=kind.startswith("chat")).json()
    assert _keys(got) == _keys(real[0])


# -- endpoints ---------------------------------------------------------------------------------
def test_metrics_is_prometheus_text(live):
    response = requests.get(live.url + "/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_METRICS
    names = set(shape(response.text))
    for family in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:iteration_tokens_total", "vllm:kv_cache_usage_perc",
                   "vllm:prefix_cache_queries", "process_start_time_seconds", "python_info",
                   "http_request_duration_highr_seconds"):
        assert family in names, family


def test_health_version_and_models_answer(live):
    health = requests.get(live.url + "/health", timeout=5)
    assert (health.status_code, health.content) == (200, b"")
    assert requests.get(live.url + "/version", timeout=5).json() == {"version": "0.32.0"}
    models = requests.get(live.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == live.model


def test_completion_goes_through_the_engine_and_honours_max_tokens(live):
    response = complete(live, max_tokens=5)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"
    page = scrape(live)
    assert sample(page, "vllm:request_success_total", finished_reason="length") == 1.0
    assert sample(page, "vllm:generation_tokens_total") == 5.0
    assert live.inference_requests == 1


def test_chat_completion_answers_with_usage(live):
    body = complete(live, max_tokens=3, chat=True).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3


def test_inference_requests_count_only_completions(live):
    requests.get(live.url + "/metrics", timeout=5)
    requests.get(live.url + "/v1/models", timeout=5)
    requests.get(live.url + "/health", timeout=5)
    assert live.inference_requests == 0
    complete(live, max_tokens=1)
    assert live.inference_requests == 1


def test_http_families_follow_traffic_but_not_excluded_handlers(live):
    requests.get(live.url + "/health", timeout=5)
    page = scrape(live)
    assert sample(page, "http_requests_total") is None
    requests.get(live.url + "/v1/models", timeout=5)
    page = scrape(live)
    assert sample(page, "http_requests_total", handler="/v1/models", method="GET", status="2xx") == 1.0
    assert sample(page, "http_requests_total", handler="/health") is None


# -- states ------------------------------------------------------------------------------------
def test_busy_moves_tokens_iterations_and_kv(sim):
    sim.set_state("busy", n=3)
    sim.tick(0.5)
    first = scrape(sim)
    sim.tick(0.5)
    second = scrape(sim)
    assert sample(second, "vllm:num_requests_running") == 3.0
    for name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count",
                 "vllm:iteration_tokens_total_sum"):
        assert sample(second, name) > sample(first, name), name
    assert sample(second, "vllm:kv_cache_usage_perc") != sample(first, "vllm:kv_cache_usage_perc")


def test_saturated_runs_max_num_seqs_with_a_queue():
    s = Simulator(manual_clock=True, max_num_seqs=4).start()
    try:
        s.set_state("saturated", waiting=3)
        s.tick(0.2)
        page = scrape(s)
        assert sample(page, "vllm:num_requests_running") == 4.0
        assert sample(page, "vllm:num_requests_waiting") == 3.0
        assert sample(page, "vllm:num_requests_waiting_by_reason", reason="capacity") == 3.0
    finally:
        s.stop()


def test_long_prefill_moves_kv_only(sim):
    before = sample(scrape(sim), "vllm:prefix_cache_queries_total")
    sim.set_state("long_prefill", prompt_tokens=30000)
    sim.tick(0.5)
    first = scrape(sim)
    sim.tick(1.0)
    second = scrape(sim)
    assert sample(first, "vllm:prefix_cache_queries_total") - before == 30000
    assert sample(second, "vllm:num_requests_running") == 1.0
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum"):
        assert sample(second, name) == sample(first, name), f"{name} moved during prefill"
    assert sample(second, "vllm:kv_cache_usage_perc") > sample(first, "vllm:kv_cache_usage_perc")


def test_long_prefill_ends_in_the_first_token(sim):
    sim.set_state("long_prefill", prompt_tokens=4096, max_tokens=4)
    sim.tick(5.0)
    page = scrape(sim)
    assert sample(page, "vllm:prompt_tokens_total") == 4096
    assert sample(page, "vllm:generation_tokens_total") == 4


def test_frozen_page_stays_identical_while_health_answers(sim):
    sim.set_state("busy", n=2)
    sim.tick(0.5)
    sim.set_state("frozen")
    first = scrape(sim)
    sim.tick(5.0)
    second = scrape(sim)
    assert vllm_lines(first) == vllm_lines(second)
    assert sample(second, "vllm:num_requests_running") == 2.0
    assert requests.get(sim.url + "/health", timeout=1).status_code == 200


def test_frozen_completion_hangs_and_never_waits_in_the_queue(live):
    live.set_state("frozen_idle")
    with pytest.raises(requests.exceptions.ReadTimeout):
        complete(live, timeout=0.5)
    assert live.inference_requests == 1
    page = scrape(live)
    assert sample(page, "vllm:num_requests_waiting") == 0.0
    assert sample(page, "vllm:num_requests_running") == 0.0


def test_thaw_releases_a_blocked_completion(live):
    live.set_state("frozen")
    thread, result = in_background(complete, live, 2, 10)
    wait_until(lambda: live.inference_requests == 1, what="the request to arrive")
    assert thread.is_alive()
    live.set_state("idle")
    thread.join(10)
    assert result["value"].status_code == 200


def test_restart_resets_counters_and_start_time(sim):
    sim.set_state("busy", n=2)
    sim.tick(1.0)
    before = scrape(sim)
    sim.tick(1.0)
    sim.restart()
    after = scrape(sim)
    assert sample(after, "process_start_time_seconds") > sample(before, "process_start_time_seconds")
    assert sample(before, "vllm:generation_tokens_total") > 0
    assert sample(after, "vllm:generation_tokens_total") == 0
    assert sample(after, "vllm:generation_tokens_created") > sample(before, "vllm:generation_tokens_created")
    assert sample(after, "vllm:num_requests_running") == 0


def test_metrics_missing_is_404_while_health_and_models_answer(live):
    live.set_state("metrics_missing")
    assert requests.get(live.url + "/metrics", timeout=5).status_code == 404
    assert requests.get(live.url + "/health", timeout=5).status_code == 200
    assert requests.get(live.url + "/v1/models", timeout=5).status_code == 200


def test_metrics_garbage_is_200_without_vllm_families(live):
    live.set_state("metrics_garbage")
    response = requests.get(live.url + "/metrics", timeout=5)
    assert response.status_code == 200
    assert "vllm:" not in response.text


def test_asleep_shows_weights_offloaded(live):
    live.set_state("asleep", level=1)
    page = scrape(live)
    assert sample(page, "vllm:engine_sleep_state", sleep_state="awake") == 0.0
    assert sample(page, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1.0
    live.set_state("idle")
    assert sample(scrape(live), "vllm:engine_sleep_state", sleep_state="awake") == 1.0


def test_dead_refuses_connections_and_revive_comes_back_fresh(live):
    port = live.port
    live.set_state("busy", n=1)
    wait_until(lambda: sample(scrape(live), "vllm:generation_tokens_total") > 0, what="tokens")
    live.set_state("dead")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(live.url + "/health", timeout=1)
    live.revive()
    assert live.port == port
    assert requests.get(live.url + "/health", timeout=5).status_code == 200
    assert sample(scrape(live), "vllm:generation_tokens_total") == 0


def test_dead_drops_blocked_completions(live):
    live.set_state("frozen")
    thread, result = in_background(complete, live, 2, 10)
    wait_until(lambda: live.inference_requests == 1, what="the request to arrive")
    live.kill()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), requests.exceptions.ConnectionError)


def test_unresponsive_accepts_but_never_answers(live):
    live.set_state("unresponsive")
    with socket.create_connection(("127.0.0.1", live.port), timeout=1):
        pass                                                  # the connection is accepted
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(live.url + "/health", timeout=0.5)
    assert time.monotonic() - started < 3
    live.set_state("idle")
    assert requests.get(live.url + "/health", timeout=5).status_code == 200


def test_stop_releases_unresponsive_connections():
    s = Simulator().start()
    s.set_state("unresponsive")
    thread, result = in_background(requests.get, s.url + "/health", timeout=10)
    wait_until(lambda: len(s._conns) >= 1, what="the connection")
    s.stop()
    thread.join(5)
    assert not thread.is_alive() and "error" in result


def test_multiprocess_page_has_no_process_python_or_created_series():
    s = Simulator(multiprocess=True, manual_clock=True).start()
    try:
        page = scrape(s)
        names = set(shape(page))
        assert not [n for n in names if n.startswith(("process_", "python_")) or n.endswith("_created")]
        assert "vllm:num_requests_running" in names
        assert sample(page, "vllm:num_requests_running") is None
        assert sample(page, "vllm:kv_cache_usage_perc") is None
        s.set_state("busy", n=1)
        s.tick(0.2)
        assert sample(scrape(s), "vllm:num_requests_running") == 1.0
    finally:
        s.stop()


# -- the command line --------------------------------------------------------------------------
def test_command_line_serves_and_is_driven_over_http(tmp_path):
    proc = Process("simulator", [sys.executable, "-m", "hangwatch.simulator", "--listen", "127.0.0.1:0",
                                 "--model", "demo", "--scenario", "busy"], tmp_path / "simulator.log").start()
    try:
        url = f"http://127.0.0.1:{proc.wait_port()}"

        def running():
            return sample(requests.get(url + "/metrics", timeout=1).text,
                          "vllm:num_requests_running", model_name="demo") == 3.0
        support_wait_until(running, 20, "the simulator process to be busy", ignore=(requests.ConnectionError,))
        assert requests.post(url + "/_sim/state", json={"state": "frozen"}, timeout=5).ok
        assert requests.get(url + "/_sim/state", timeout=5).json()["state"] == "frozen"
    finally:
        proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


def test_command_line_listens_where_it_is_told(tmp_path):
    """The compose ``sim`` profile runs it on 0.0.0.0 (no relay in front of it)."""
    proc = Process("simulator", [sys.executable, "-m", "hangwatch.simulator", "--listen", "0.0.0.0:0"],
                   tmp_path / "simulator.log").start()
    try:
        port = proc.wait_port()
        support_wait_until(lambda: "listening on http://0.0.0.0:" in proc.log_tail(), 20,
                           "the simulator to announce 0.0.0.0")
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok
    finally:
        proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()


def test_an_address_it_cannot_bind_exits_64(capsys):
    assert main(["--listen", "192.0.2.1:8000"]) == 64      # TEST-NET-1: never this host's address
    assert "cannot listen on 192.0.2.1:8000" in capsys.readouterr().err


def test_the_controls_answer_in_every_state_unresponsive_and_dead_included(tmp_path):
    """``/_sim/state`` is not the simulated server: an unresponsive server's controls still answer on
    its own port (before, they were held with everything else: the only way out was a kill), and a
    dead one's on the control port (``--control-listen``), which a kill never closes."""
    from hangwatch.demo.chain import hangwatch_command
    proc = Process("simulator", [*hangwatch_command(), "simulate", "--listen", "127.0.0.1:0",
                                 "--control-listen", "127.0.0.1:0"], tmp_path / "simulator.log").start()
    try:
        banner = support_wait_until(lambda: re.search(r"listening on (http://\S+); controls on (http://\S+)/_sim/state",
                                                      proc.log_text()), 20, "the simulator's banner")
        url, control = banner.group(1), banner.group(2)
        assert requests.post(url + "/_sim/state", json={"state": "unresponsive"}, timeout=5).ok
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.get(url + "/health", timeout=0.5)          # the server answers nothing ...
        answer = requests.get(url + "/_sim/state", timeout=5)  # ... but its controls do, on its own port
        assert answer.json()["state"] == "unresponsive"
        assert requests.post(url + "/_sim/state", json={"state": "idle"}, timeout=5).ok
        assert requests.get(url + "/health", timeout=5).status_code == 200

        assert requests.post(control + "/_sim/state", json={"state": "dead"}, timeout=5).ok
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(url + "/health", timeout=5)            # refused: the simulated server is gone
        assert requests.get(control + "/_sim/state", timeout=5).json()["state"] == "dead"
        assert requests.post(control + "/_sim/state", json={"state": "idle"}, timeout=5).ok
        assert requests.get(url + "/health", timeout=5).status_code == 200
        assert requests.post(control + "/_sim/state", json=["no"], timeout=5).status_code == 400
    finally:
        proc.stop()
    assert proc.popen.returncode == 0, proc.log_tail()
