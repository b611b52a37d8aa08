"""The real tier's waits end on the evidence their assertions read, not on something that can be
true before it exists (issue 33): here on made-up readings, so each wait's condition is judged
without the real part and without a race to be lucky in.
"""
from __future__ import annotations

import threading

import pytest

from hangwatch.demo.processes import Process
from harness.stack import Stack
from harness.vllm_server import parse_prometheus
from tests.real.test_real_vllm_verdicts import both_counted, inference_requests
from tests.real_llamacpp.llamacpp_server import LlamaServer

PAGE = """http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} {http}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny-llama"}} {engine}
"""


class Pages:
    """A server whose /metrics pages are these, one per reading (``VLLMServer.wait_until``'s shape)."""

    def __init__(self, *pages):
        self.pages = [parse_prometheus(PAGE.format(http=http, engine=engine)) for http, engine in pages]

    def wait_until(self, predicate, deadline_s, interval=0.1, what="condition"):
        for page in self.pages:
            if predicate(page):
                return page
        raise AssertionError(f"never: {what}")


def test_a_request_is_counted_once_both_of_vllms_counters_moved_not_their_sum():
    server = Pages((10, 10), (11, 10), (11, 11))  # before; the HTTP count alone; both
    counted = both_counted(server, server.pages[0])
    assert counted is server.pages[2]
    assert inference_requests(counted) - inference_requests(server.pages[0]) == 2


def stack_answering(tmp_path, answers: dict[str, list]) -> Stack:
    """A Stack whose Prometheus answers each query (by its first word) with the next value given."""
    stack = Stack(tmp_path)
    stack.default_target = "vllm-a"
    stack.asked = []

    def value(expr):
        stack.asked.append(expr)
        queue = answers[expr.split("(", 1)[0]]
        return queue.pop(0) if len(queue) > 1 else queue[0]
    stack.value = value
    return stack


@pytest.mark.parametrize("seconds", [0.4, 2.4, 2.6, 61.2])
def test_ever_asks_of_at_least_the_seconds_it_is_given_and_not_a_second_more(tmp_path, seconds):
    stack = stack_answering(tmp_path, {"max_over_time": [0]})
    stack.ever("hung", seconds)
    window = stack.asked[0].rsplit("[", 1)[1].rstrip("])")
    assert window.endswith("ms"), window
    assert seconds <= int(window[:-2]) / 1000 < seconds + 0.002


def test_a_span_is_judged_once_an_evaluation_has_a_reading_scraped_after_it(tmp_path):
    since = 1000.0
    # (latest scrape's start, latest evaluation): a scrape from before the span's end; one from
    # after it, not yet evaluated (an evaluation can come before the scrape's samples land);
    # then evaluated with the scrape timeout passed.
    scrapes = [998.0, 1001.0, 1001.0, 1001.0]
    evaluations = [999.5, 1001.5, 1001.9, 1002.0]
    stack = stack_answering(tmp_path, {"timestamp": list(scrapes), "max": list(evaluations)})
    stack.wait_judged(since, timeout=5)
    assert len([e for e in stack.asked if e.startswith("max(")]) == 4


def test_llamacpp_tasks_are_counted_once_the_log_shows_each_ones_start_and_end(tmp_path):
    server = LlamaServer()
    server.process = Process("llama-server", [], tmp_path / "server.log")
    lines = ["slot launch_slot_: id  0 | task 0 | processing task, is_child = 0",
             "slot      release: id  0 | task 0 | stop processing: n_tokens = 9, truncated = 0",
             "slot launch_slot_: id  1 | task 1 | processing task, is_child = 0"]
    (tmp_path / "server.log").write_text("\n".join(lines) + "\n")
    # The second task's end is not in the log yet (its own thread writes it a moment later).
    late = threading.Timer(0.5, lambda: (tmp_path / "server.log").write_text(
        "\n".join([*lines, "slot      release: id  1 | task 1 | stop processing: n_tokens = 9, truncated = 0"]) + "\n"))
    late.start()
    try:
        assert server.tasks_logged(in_flight=1, deadline_s=0.2) == 2  # one still running: so the log says
        assert server.tasks_logged(at_least=2, deadline_s=5) == 2
        assert "stop processing" in server.log_text().splitlines()[-1]
    finally:
        late.cancel()
