"""The soak's witnesses can fail: the recording proxy flags a request sent while anything was
in flight (by the server's gauges or by the clients' own ledger), passes hangwatch's own
traffic through unchanged, and the naive watchdog counts "N failures in a row" as it claims.

Fast (the vLLM simulator and a tiny slow server, no real parts); the soak itself is
tests/real_soak/test_soak_short.py.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from bench.soak_load import InFlight, NaiveWatchdog
from bench.soak_proxy import RecordingProxy, _read_body
from hangwatch.simulator import Simulator
from tests.sim_fixtures import wait_until


@pytest.fixture
def sim():
    simulator = Simulator().start()
    try:
        yield simulator
    finally:
        simulator.stop()


@pytest.fixture
def proxied(sim):
    ledger = InFlight()
    proxy = RecordingProxy(sim.url, ledger).start()
    try:
        yield sim, proxy, ledger
    finally:
        proxy.close()


def hangwatch_check(url: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", url, "--interval", "0.5", "--json"],
                          capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def completion(url: str) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 1},
                         timeout=10)


def test_hangwatch_at_idle_is_recorded_as_an_idle_probe(proxied):
    sim, proxy, _ = proxied
    result = hangwatch_check(proxy.url)
    assert (result["verdict"], result["probe_sent"]) == ("idle", True)
    sent = proxy.sent()
    posts = [r for r in sent if r.method == "POST"]
    assert [r.path for r in posts] == ["/v1/completions"]
    assert posts[0].server_in_flight == 0 and posts[0].clients_in_flight == 0 and not posts[0].while_busy
    assert any(r.path == "/metrics" and r.read_only for r in sent)


def test_hangwatch_while_busy_sends_only_reads(proxied):
    sim, proxy, _ = proxied
    sim.set_state("busy", n=3)
    result = hangwatch_check(proxy.url)
    assert result["verdict"] == "busy" and not result["probe_sent"]
    sent = proxy.sent()
    assert sent and all(r.read_only for r in sent) and not any(r.while_busy for r in sent)


def test_a_request_while_the_server_is_busy_is_flagged(proxied):
    sim, proxy, _ = proxied
    sim.set_state("busy", n=3)
    completion(proxy.url)
    [post] = [r for r in proxy.sent() if r.method == "POST"]
    assert post.server_in_flight >= 3 and post.clients_in_flight == 0 and post.while_busy


def test_a_request_while_a_client_has_one_open_is_flagged(proxied):
    sim, proxy, ledger = proxied
    ledger.opened("generation")  # the load's own ledger says a request is open
    completion(proxy.url)
    ledger.closed("generation")
    [post] = [r for r in proxy.sent() if r.method == "POST"]
    assert post.clients_in_flight == 1 and post.server_in_flight == 0 and post.while_busy


def test_keep_alive_requests_pass_unchanged_and_each_is_recorded(proxied):
    sim, proxy, _ = proxied
    with requests.Session() as session:
        assert "vllm:num_requests_running" in session.get(proxy.url + "/metrics", timeout=5).text
        answer = session.post(
            proxy.url + "/v1/completions", timeout=10,
            json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        assert session.get(proxy.url + "/version", timeout=5).status_code == 200
    assert [(r.method, r.path) for r in proxy.sent()] == [
        ("GET", "/metrics"), ("POST", "/v1/completions"), ("GET", "/version")]


def test_a_chunked_body_is_framed_to_its_end():
    ours, theirs = socket.socketpair()
    body = b"5\r\nhello\r\n3;x=1\r\nabc\r\n0\r\n\r\n"
    following = b"GET /metrics HTTP/1.1\r\n\r\n"
    theirs.sendall(body + following)
    got, rest = _read_body(ours, b"", {"transfer-encoding": "chunked"})
    assert (got, rest) == (body, following)
    theirs.sendall(b"0\r\nX-Trailer: 1\r\n\r\n")
    got, rest = _read_body(ours, b"", {"transfer-encoding": "chunked"})
    assert (got, rest) == (b"0\r\nX-Trailer: 1\r\n\r\n", b"")
    ours.close()
    theirs.close()


class _Slow(BaseHTTPRequestHandler):
    delay = 0.0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(type(self).delay)
        body = b'{"usage": {"completion_tokens": 1}}'
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_the_naive_watchdog_restarts_after_n_slow_answers_in_a_row():
    class Handler(_Slow):
        delay = 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ledger = InFlight()
    naive = NaiveWatchdog(url, ledger, interval_s=0.3, timeout_s=0.2, failures=3).start()
    try:
        wait_until(lambda: len(naive.snapshot()[0]) >= 3, 10, "three fast checks")
        assert naive.snapshot()[1] == []                       # answered in time: no restart
        Handler.delay = 0.5                                     # now slower than the timeout
        wait_until(lambda: len(naive.snapshot()[1]) >= 2, 20, "two restarts")
    finally:
        naive.stop()
        Handler.delay = 0.0
        server.shutdown()
    checks, restarts = naive.snapshot()
    failed = [c for c in checks if not c.ok]
    assert len(failed) >= 6 and all(c.ended_at - c.sent_at < 0.45 for c in failed)
    assert restarts[0] == failed[2].ended_at and restarts[1] == failed[5].ended_at  # every third in a row
    assert ledger.total() == 0


def test_the_proxy_port_is_loopback(proxied):
    _, proxy, _ = proxied
    host = proxy.url.split("//", 1)[1].rsplit(":", 1)[0]
    assert host == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])), timeout=2):
        pass


def test_a_request_after_an_idle_reading_is_the_loads_onset_and_after_a_busy_one_a_harm():
    from bench.soak import _raced_with_onset
    from bench.soak_proxy import Sent
    reads = [Sent(10.0, 0, "GET", "/metrics", 0, None), Sent(13.0, 0, "GET", "/metrics", 7, None)]
    onset = [Sent(10.17, 0, "GET", "/v1/models", 7, 7.0), Sent(10.2, 0, "POST", "/v1/completions", 7, 7.0)]
    harm = [Sent(13.1, 0, "POST", "/v1/completions", 7, 7.0)]
    late = [Sent(12.5, 0, "POST", "/v1/completions", 7, 7.0)]  # its reading is 2.5 s old: no excuse
    sent = reads + onset + harm + late
    busy = [r for r in sent if r.while_busy]
    assert busy == onset + harm + late
    assert _raced_with_onset(sent, busy) == onset
