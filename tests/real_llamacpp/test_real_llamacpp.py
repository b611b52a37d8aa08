"""hangwatch against a real llama-server: every verdict the issue lists, through ``check`` and
through the exporter's collector, with llama.cpp's own counters and log as the witness.

Facts honoured (measured here, REAL-PARTS.md): ``n_decode_total`` is the heartbeat;
``tokens_predicted_total`` moves only when a request finishes; one long prompt batch moves
nothing at all for seconds; a stopped process accepts connections and answers nothing.
"No probe while busy" is proven from the server's side: every request becomes one slot
task (``processing task`` in its log) and a probe would add one task and one predicted
token to ``tokens_predicted_total``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from hangwatch.check import check
from hangwatch.verdict import judge
from tests.real_llamacpp.llamacpp_server import SLOTS, metric
from tests.support.exposition import samples, scrape

pytestmark = pytest.mark.real

PROCESSING, DEFERRED = "llamacpp:requests_processing", "llamacpp:requests_deferred"
DECODE, PREDICTED, PROMPT = "llamacpp:n_decode_total", "llamacpp:tokens_predicted_total", \
    "llamacpp:prompt_tokens_total"
LONG_PROMPT_SECONDS = 10.0  # one -b/-ub 4096 batch with nothing moving, sized per machine (prompt_tokens_lasting)
INTERVAL = 1.5  # check's interval during the long prompt: its 4 readings span 4.5 s


def exporter_scrape(url: str, budget: float = 10.0) -> dict:
    """One /probe scrape's series, through the exporter's own prober."""
    return samples(scrape(url, "backend", budget))


def info_engine(series: dict) -> str:
    return next(dict(labels)["engine"] for (name, labels) in series if name == "hangwatch_backend_info")


def test_idle_server_is_probed_and_only_then(llamacpp):
    tasks, predicted = llamacpp.tasks_logged(), llamacpp.value(PREDICTED)
    result = check(llamacpp.url, interval=1, timeout=10)
    assert result.verdict.state == "idle", result.verdict.reason
    assert result.exit_code == 0 and result.probe_sent
    assert result.as_json()["engine"] == "llamacpp"
    series = exporter_scrape(llamacpp.url)
    assert series[("hangwatch_probe_success", ())] == 1
    assert series[("hangwatch_requests_in_flight", ())] == 0
    assert info_engine(series) == "llamacpp"
    # llama.cpp's side: exactly two 1-token tasks (check's probe and the exporter's).
    llamacpp.wait_idle()
    assert llamacpp.tasks_logged(at_least=tasks + 2) - tasks == 2, llamacpp.log_tail()
    assert llamacpp.value(PREDICTED) - predicted == 2


def test_four_busy_slots_and_two_deferred_are_busy_and_never_probed(llamacpp):
    n_predict = llamacpp.n_predict_lasting(3, concurrent=SLOTS)  # 4 at a time: twice that; check takes ~2 s
    tasks, predicted = llamacpp.tasks_logged(), llamacpp.value(PREDICTED)
    load = llamacpp.completions(6, n_predict=n_predict)
    llamacpp.wait_until(lambda t: metric(t, PROCESSING) == 4 and metric(t, DEFERRED) == 2, 60,
                        "4 processing + 2 deferred")
    result = check(llamacpp.url, interval=1, timeout=10)
    assert result.verdict.state == "busy", result.verdict.reason
    assert not result.probe_sent and result.exit_code == 0
    assert "steps" in result.verdict.reason  # n_decode_total moved: the heartbeat
    reading = result.last_reading
    assert (reading.running, reading.waiting) == (4, 2)
    series = exporter_scrape(llamacpp.url)
    assert series[("hangwatch_requests_in_flight", ())] >= 5
    assert not any(name in ("hangwatch_probe_success", "hangwatch_probe_duration_seconds") for name, _ in series)
    assert series[("hangwatch_probe_failed", ())] == 0
    assert info_engine(series) == "llamacpp"
    load.wait(300)
    assert not load.errors, load.errors
    llamacpp.wait_idle()
    # llama.cpp's own record: our six tasks and nothing else; exactly our tokens.
    assert llamacpp.tasks_logged(at_least=tasks + 6) - tasks == 6, llamacpp.log_tail()
    assert llamacpp.value(PREDICTED) - predicted == 6 * n_predict


def test_tokens_predicted_moves_only_when_a_request_finishes(llamacpp):
    n_predict = llamacpp.n_predict_lasting(2)  # ten decode batches take 0.1 s of it
    load = llamacpp.completions(1, n_predict=n_predict)
    first = llamacpp.wait_until(lambda t: metric(t, PROCESSING) == 1, 30, "one request processing")
    # Decoding goes on (more decode batches) while the request still runs ...
    second = llamacpp.wait_until(lambda t: metric(t, DECODE) >= metric(first, DECODE) + 10
                                 or not metric(t, PROCESSING), 30, "ten more decode batches")
    assert metric(second, PROCESSING) == 1, "finished too fast to observe"
    # ... and the predicted-token counter does not move until the request ends.
    assert metric(second, PREDICTED) == metric(first, PREDICTED)
    load.wait(120)
    assert metric(llamacpp.metrics_text(), PREDICTED) == metric(first, PREDICTED) + n_predict


def test_one_long_prompt_batch_is_busy_not_hung(llamacpp):
    """One long prompt (sized to last ~10 s on this machine, at most 3,800 tokens) is one
    llama_decode() call: nothing moves for many seconds — not n_decode_total, not the token
    counters, not /slots. check (1.5 s apart) must say busy, and must say it although its
    readings saw no progress: the engine's grace, not luck."""
    prompt_tokens = llamacpp.prompt_tokens_lasting(LONG_PROMPT_SECONDS)
    prompt = llamacpp.prompt_of(prompt_tokens)
    # decoding after the batch outlasts a check interval (and fits the context after the prompt)
    answer_tokens = llamacpp.n_predict_lasting(INTERVAL + 0.5, prompt_tokens=prompt_tokens)
    before = llamacpp.metrics_text()
    tasks = llamacpp.tasks_logged()
    samples: list[tuple[float, float, float, float]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                text = llamacpp.metrics_text()
                samples.append((time.monotonic(), metric(text, DECODE), metric(text, PROMPT),
                                metric(text, PROCESSING)))
            except Exception:  # noqa: BLE001 - a slow answer is a gap, not a failure
                pass
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    load = llamacpp.completions(1, n_predict=answer_tokens, prompt=prompt)
    llamacpp.wait_until(lambda t: metric(t, PROCESSING) == 1, 30, "the long prompt processing")
    sampler.start()
    series = exporter_scrape(llamacpp.url)  # inside the batch
    started = time.monotonic()
    result = check(llamacpp.url, interval=INTERVAL, timeout=10)
    check_span = time.monotonic() - started
    load.wait(300)
    stop.set()
    sampler.join(5)
    assert not load.errors, load.errors

    # check keeps reading through the silent batch (the engine's grace), never calls it hung,
    # and settles once the answer's decoding moves n_decode again.
    assert result.verdict.state == "busy", result.verdict.reason
    assert not result.probe_sent and result.exit_code == 0
    silent = [o for o in result.observations if o.reading.steps == result.observations[0].reading.steps]
    assert len(silent) >= 3, f"only {len(silent)} readings inside the batch: too short to prove the grace"
    verdicts = [judge(result.observations[:i + 1]) for i in range(len(result.observations))]
    assert all(v.state == "busy" for v in verdicts), [v.reason for v in verdicts]
    assert any("grace" in v.reason for v in verdicts[:len(silent)]), [v.reason for v in verdicts]
    assert series[("hangwatch_requests_in_flight", ())] == 1
    assert not any(name in ("hangwatch_probe_success", "hangwatch_probe_duration_seconds") for name, _ in series)
    assert series[("hangwatch_probe_failed", ())] == 0
    assert llamacpp.tasks_logged(at_least=tasks + 1) - tasks == 1  # the prompt itself, no probe

    # The measured fact behind the grace: the longest stretch with the prompt in flight and
    # n_decode_total and prompt_tokens_total flat.
    flat, run_start = 0.0, None
    for (t0, d0, p0, r0), (t1, d1, p1, r1) in zip(samples, samples[1:]):
        if r0 == 1 and d1 == d0 and p1 == p0:
            run_start = t0 if run_start is None else run_start
            flat = max(flat, t1 - run_start)
        else:
            run_start = None
    print(f"long prompt: nothing moved for {flat:.1f} s (check span {check_span:.1f} s); "
          f"prompt_tokens_total {metric(before, PROMPT):g} -> {llamacpp.value(PROMPT):g} (after the prompt)")
    assert flat >= 2 * INTERVAL, f"the batch took only {flat:.1f} s with nothing moving"


def test_slots_advance_only_at_batch_boundaries(llamacpp):
    """Why /slots is no fallback: during the one long batch it shows no prompt progress
    either (n_prompt_tokens_processed stays 0, then jumps to the prompt length)."""
    assert llamacpp.slots() is not None, "/slots does not answer (the fixture starts the server with --slots)"
    prompt_tokens = llamacpp.prompt_tokens_lasting(LONG_PROMPT_SECONDS)
    prompt = llamacpp.prompt_of(prompt_tokens)
    load = llamacpp.completions(1, n_predict=llamacpp.n_predict_lasting(INTERVAL + 0.5, prompt_tokens=prompt_tokens),
                                prompt=prompt)
    llamacpp.wait_until(lambda t: metric(t, PROCESSING) == 1, 30, "the long prompt processing")
    started, first, changed_after = time.monotonic(), None, None
    while time.monotonic() - started < 4 and changed_after is None:
        busy = [slot for slot in llamacpp.slots() if slot.get("is_processing")]
        if busy:
            snapshot = json.dumps(busy, sort_keys=True)
            first = first or (snapshot, busy[0])
            if snapshot != first[0]:
                changed_after = time.monotonic() - started
        time.sleep(0.2)
    load.wait(300)
    assert first is not None and "n_prompt_tokens_processed" in first[1], first
    assert changed_after is None or changed_after >= 3, f"/slots moved after {changed_after:.1f} s"


def test_stopped_process_is_hung_and_healthy_again_after_cont(llamacpp):
    load = llamacpp.completions(4, n_predict=llamacpp.n_predict_lasting(4, concurrent=4))  # paused while frozen
    llamacpp.wait_until(lambda t: metric(t, PROCESSING) == 4, 60, "4 processing")
    tasks = llamacpp.tasks_logged(in_flight=4)  # the four started, nothing else in flight
    before_freeze = llamacpp.metrics_text()
    llamacpp.freeze()
    try:
        result = check(llamacpp.url, interval=1, timeout=2)
        assert result.verdict.state == "hung", result.verdict.reason
        assert result.exit_code == 1 and not result.probe_sent
        assert "2 times in a row" in result.verdict.reason
        series = exporter_scrape(llamacpp.url, budget=4)
        assert series[("hangwatch_up", ())] == 0
        assert series[("hangwatch_connection_stalled", ())] == 1
    finally:
        llamacpp.thaw()
    llamacpp.wait_progress(before_freeze)  # judged once it decodes again, not at the instant of SIGCONT
    healthy = check(llamacpp.url, interval=1, timeout=10)
    assert healthy.verdict.state == "busy", healthy.verdict.reason
    assert healthy.exit_code == 0 and not healthy.probe_sent
    load.wait(300)
    assert not load.errors, load.errors
    llamacpp.wait_idle()
    assert llamacpp.tasks_logged() == tasks  # no probe reached it, frozen or thawed
    assert check(llamacpp.url, interval=1, timeout=10).verdict.state == "idle"


def test_refused_connection_is_down():
    from tests.support.pages import closed_port
    result = check(f"http://127.0.0.1:{closed_port()}", interval=0.5, timeout=2)
    assert result.verdict.state == "down" and result.exit_code == 2


def test_cli_reports_the_engine_and_exit_code(llamacpp):
    """`hangwatch check URL --json` (what a HEALTHCHECK runs) on the idle server."""
    answer = subprocess.run([sys.executable, "-m", "hangwatch", "check", llamacpp.url, "--json",
                             "--interval", "1"], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    verdict = json.loads(answer.stdout)
    assert (verdict["verdict"], verdict["engine"], verdict["probe_sent"]) == ("idle", "llamacpp", True)
