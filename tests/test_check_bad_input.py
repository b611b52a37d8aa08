"""Bad input never crashes: every broken backend becomes down, blind or hung with a reason."""
import json
import re
import subprocess
import sys
import time

import pytest

from hangwatch.check import check
from tests.support.pages import Page, PageServer, closed_port
from tests.test_reading import VLLM_TWO_ENGINES

IDLE_PAGE = re.sub(r"(vllm:num_requests_(?:running|waiting)\{[^}]*\}) \S+", r"\1 0.0", VLLM_TWO_ENGINES)


@pytest.fixture
def server():
    s = PageServer()
    yield s
    s.stop()


def fast_check(url, **kw):
    return check(url, interval=0.05, timeout=kw.pop("timeout", 1.0), **kw)


def test_connection_refused_is_down(server):
    result = fast_check(f"http://127.0.0.1:{closed_port()}")
    assert (result.verdict.state, result.exit_code) == ("down", 2)
    assert "refused" in result.verdict.reason


def test_accepting_but_silent_server_is_hung_after_two_timeouts(server):
    server.pages["/metrics"] = Page(silent=True)
    result = fast_check(server.url, timeout=0.3)
    assert (result.verdict.state, result.exit_code) == ("hung", 1)
    assert len(result.observations) == 2


@pytest.mark.parametrize("page, why", [
    (Page(b"internal error", 500), "HTTP 500"),
    (Page(b"<html><body>hello</body></html>", content_type="text/html"), "no known engine"),
    (Page(VLLM_TWO_ENGINES[:300].encode()), "truncated"),
    (Page(VLLM_TWO_ENGINES.replace("} 2.0", "} NaN").encode()), "non-finite"),
    (Page(VLLM_TWO_ENGINES.replace("} 0.25", "} -Inf").encode()), "non-finite"),
    (Page((VLLM_TWO_ENGINES * 2).encode()), "duplicate series"),
    (Page(b"\xff\xfe\x00garbage\x00" * 100, content_type="application/octet-stream"), "no known engine"),
])
def test_unusable_metrics_from_an_answering_server_is_blind(server, page, why):
    server.pages["/metrics"] = page
    result = fast_check(server.url)
    assert (result.verdict.state, result.exit_code) == ("blind", 2)
    assert why in result.verdict.reason
    assert not result.probe_sent


def test_missing_metrics_endpoint_is_blind(server):
    result = fast_check(server.url)
    assert result.verdict.state == "blind" and "404" in result.verdict.reason


def test_a_100_mb_page_is_cut_off_at_the_size_cap(server):
    chunk = b"# filler " + b"x" * 65526 + b"\n"
    server.pages["/metrics"] = Page(chunks=(chunk for _ in range(1600)))  # ~100 MB
    started = time.monotonic()
    result = fast_check(server.url, timeout=10)
    assert result.verdict.state == "blind" and "exceeds" in result.verdict.reason
    assert time.monotonic() - started < 5


def test_idle_server_gets_one_tiny_probe(server):
    server.pages["/metrics"] = Page(IDLE_PAGE.encode())
    server.pages["/v1/models"] = Page(b'{"object":"list","data":[{"id":"tiny","object":"model"}]}',
                                      content_type="application/json")
    server.pages["/v1/completions"] = Page(b'{"choices":[{"text":"x"}]}', content_type="application/json")
    result = fast_check(server.url)
    assert result.verdict.state == "idle" and result.probe_sent
    assert [r for r in server.requests if r[0] == "POST"] == [("POST", "/v1/completions")]


def test_busy_server_is_never_probed(server):
    server.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    result = fast_check(server.url)
    # The page never changes: this is a frozen engine with work in flight.
    assert result.verdict.state == "hung" and not result.probe_sent
    assert all(method == "GET" and path == "/metrics" for method, path in server.requests)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True, timeout=60)


def test_cli_json_prints_exactly_one_object(server):
    server.pages["/metrics"] = Page(b"<html></html>")
    done = run_cli("check", server.url, "--json", "--interval", "0.1", "--timeout", "1")
    assert done.returncode == 2
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert {"verdict", "reason", "in_flight", "probe_sent", "engine", "module"} <= data.keys()
    assert data["verdict"] == "blind" and data["probe_sent"] is False and data["module"] == "backend"


def test_cli_proxy_asks_only_v1_models(server):
    server.pages["/v1/models"] = Page(b'{"data":[]}', content_type="application/json")
    server.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    done = run_cli("check", "--proxy", server.url, "--json", "--interval", "0.1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["module"] == "proxy"
    assert server.requests == [("GET", "/v1/models")]


@pytest.mark.parametrize("args", [
    ["check"], ["check", "not-a-url"], ["check", "http://127.0.0.1:1", "--interval", "zero"],
    ["check", "http://127.0.0.1:1", "--timeout", "-3"], ["check", "http://127.0.0.1:1", "--module", "nope"],
    ["check", "http://127.0.0.1:1", "--proxy", "http://127.0.0.1:2"], ["frobnicate"],
])
def test_bad_command_line_is_one_line_and_exit_64(args):
    done = run_cli(*args)
    assert done.returncode == 64
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


LLAMACPP_BUSY = """\
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 77
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def test_a_stuck_engine_with_a_long_minimum_grace_is_still_called_hung(server):
    """The check keeps reading until the engine's own grace (llama.cpp: one long batch) passed."""
    from hangwatch.verdict import min_grace
    server.pages["/metrics"] = Page(LLAMACPP_BUSY.encode())
    ticks = []

    def fake_clock():
        return float(len(ticks))

    def fake_sleep(seconds):
        ticks.extend([0] * int(seconds))

    result = check(server.url, interval=5, timeout=1, clock=fake_clock, sleep=fake_sleep)
    assert result.verdict.state == "hung", result.verdict.reason
    assert len(result.observations) - 1 >= min_grace("llamacpp") / 5
