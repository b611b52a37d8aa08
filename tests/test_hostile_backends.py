"""Backends that drip bytes, refuse the probe or answer 5xx: every reading ends before its deadline,
and only a probe that *failed* (no answer in time, broken, 5xx) ever counts toward hung.

The budgets below are the reading's own; the slack allows for a loaded two-core machine, never
for a second budget.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hangwatch.check import check
from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.demo.wait import wait_until
from hangwatch.observation import OK, TIMEOUT
from tests.exporter.test_probe_endpoint import probe, samples
from tests.support.hostile import HostileServer
from tests.support.pages import Page, PageServer

IDLE_PAGE = (Path(__file__).parent / "data" / "vllm-0.32" / "idle.prom").read_bytes()
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]}).encode()
COMPLETION = b'{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"x"}]}'
EMBEDDING = b'{"object":"list","data":[{"index":0,"object":"embedding","embedding":[0.1,0.2]}]}'
# A dripping server never finishes: a reading held past its deadline would run to the test's
# timeout. So the bound that is the feature ("ends at its deadline") is checked against a
# generous multiple of the deadline, which survives a loaded two-core machine.
ENDS_WITHIN = 3.0


def get(client: Client, url: str, seconds: float):
    return asyncio.run(client.request("GET", url, deadline=Deadline.after(seconds)))


@pytest.fixture
def hostile():
    servers = []

    def make(modes, **kwargs):
        server = HostileServer(modes, **kwargs)
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def backend():
    server = PageServer()
    yield server
    server.stop()


def idle_vllm(server: PageServer, **statuses: int) -> None:
    """An idle vLLM page, /v1/models, and the given HTTP status per probe route."""
    server.pages["/metrics"] = Page(IDLE_PAGE)
    server.pages["/v1/models"] = Page(MODELS, status=statuses.get("models", 200), content_type="application/json")
    server.pages["/v1/completions"] = Page(COMPLETION, status=statuses.get("completions", 200),
                                           content_type="application/json")
    server.pages["/v1/embeddings"] = Page(EMBEDDING, status=statuses.get("embeddings", 200),
                                          content_type="application/json")


# -- one deadline per reading -------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["drip_headers", "drip_body"])
def test_a_dripping_answer_ends_at_the_deadline(hostile, mode):
    server = hostile({"/metrics": mode}, gap=0.1)
    started = time.monotonic()
    fetched = get(Client(), server.url + "/metrics", 1.0)
    took = time.monotonic() - started
    assert fetched.status == TIMEOUT
    assert 0.9 <= took < 1.0 * ENDS_WITHIN, f"{mode}: one 1 s request took {took:.1f}s"


def test_a_page_sent_slowly_but_within_the_deadline_is_read_whole(hostile):
    server = hostile({"/metrics": "slow_page"}, body=IDLE_PAGE, chunk=len(IDLE_PAGE) // 5 + 1, gap=0.1)
    fetched = get(Client(), server.url + "/metrics", 5.0)
    assert fetched.status == OK and fetched.body == IDLE_PAGE


def test_a_page_sent_too_slowly_is_a_timeout_within_the_budget(hostile):
    server = hostile({"/metrics": "slow_page"}, body=IDLE_PAGE, chunk=256, gap=0.05)  # ~10 s in all
    started = time.monotonic()
    fetched = get(Client(), server.url + "/metrics", 1.0)
    assert fetched.status == TIMEOUT and time.monotonic() - started < 1.0 * ENDS_WITHIN


@pytest.mark.parametrize("route", ["/v1/models", "/v1/completions"])
def test_the_idle_probe_shares_the_readings_deadline(hostile, route):
    """/metrics answers at once; the probe drips: the whole reading still ends at its budget."""
    server = hostile({route: "drip_headers"}, body=IDLE_PAGE, bodies={"/v1/models": MODELS}, gap=0.1)
    started = time.monotonic()
    result = check(server.url, interval=0.1, timeout=1.0)
    took = time.monotonic() - started
    readings = len(result.observations)
    assert took < readings * (1.0 + 0.1) * ENDS_WITHIN, f"{readings} readings of 1 s took {took:.1f}s"
    assert all(o.probe is not None and o.probe.failed for o in result.observations)


def test_check_never_waits_longer_than_its_timeout_per_reading_on_a_dripping_server(hostile):
    server = hostile({"/metrics": "drip_headers"}, gap=0.1)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", server.url, "--timeout", "1",
                           "--interval", "0.2", "--json"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    answer = json.loads(done.stdout)
    assert answer["verdict"] == "hung" and done.returncode == 1, answer  # accepted, no answer, twice
    assert answer["readings"] == 2
    assert took < (2 * 1.0 + 0.2) * ENDS_WITHIN + 5.0, f"two 1 s readings took {took:.1f}s (process start included)"


def test_probe_answers_within_the_scrape_budget_when_the_backend_drips(hostile, exporters):
    server = hostile({"/metrics": "ok", "/v1/models": "drip_body"}, body=IDLE_PAGE, gap=0.1)
    _, url = exporters()
    started = time.monotonic()
    answer = probe(url, server.url, **{"X-Prometheus-Scrape-Timeout-Seconds": "2"})
    took = time.monotonic() - started
    got = samples(answer.text)
    assert answer.status_code == 200 and took < 2.0 * ENDS_WITHIN, f"/probe with a 2 s scrape timeout took {took:.2f}s"
    assert got[("hangwatch_probe_failed", ())] == 1 and got[("hangwatch_probe_rejected", ())] == 0


def test_a_keepalive_connection_the_server_dropped_is_never_read_as_a_failure(hostile):
    server = hostile({"/metrics": "keepalive_then_close"}, body=IDLE_PAGE, gap=0.05)
    client = Client()
    loop = asyncio.new_event_loop()  # one loop throughout: its idle connection is its own
    try:
        for n in range(1, 4):
            fetched = loop.run_until_complete(client.request("GET", server.url + "/metrics",
                                                             deadline=Deadline.after(2)))
            assert fetched.status == OK and fetched.body == IDLE_PAGE
            assert len(client.idle) == 1  # kept: the connection the server then drops
            wait_until(lambda: server.closed == n, 5, f"the server to close idle connection {n}", interval=0.01)
    finally:
        client.close()
        loop.run_until_complete(asyncio.sleep(0))  # (the aborted connection's socket closes at a turn)
        loop.close()
    assert len(server.requests) == 3


def test_a_server_that_ends_idle_connections_has_them_closed_first_once_read(hostile):
    """uvicorn (so vLLM) ends a connection idle for 5 s; a scrape comes every 15 s. Once a kept
    connection was found ended, the client closes that server's connections itself when the
    reading is done (``finished``), instead of keeping one for the server to end."""
    server = hostile({"/metrics": "keepalive_then_close"}, body=IDLE_PAGE, gap=0.05)
    client = Client()
    loop = asyncio.new_event_loop()  # one loop throughout: its idle connection is its own

    def read() -> None:
        fetched = loop.run_until_complete(client.request("GET", server.url + "/metrics", deadline=Deadline.after(2)))
        assert fetched.status == OK and fetched.body == IDLE_PAGE

    try:
        read()
        client.finished(server.url)
        assert len(client.idle) == 1  # nothing known of this server yet: kept
        wait_until(lambda: server.closed == 1, 5, "the server to close the idle connection", interval=0.01)
        read()  # the kept one is found ended: a new one
        client.finished(server.url)
        assert len(client.idle) == 0  # closed by us, before the server ends it
        read()
        assert len(client.idle) == 1  # kept between the readings of one scrape
    finally:
        client.close()
        loop.run_until_complete(asyncio.sleep(0))  # (the aborted connection's socket closes at a turn)
        loop.close()
    assert len(server.requests) == 3


def test_one_keepalive_connection_serves_reading_after_reading(backend):
    """The exporter reads the same backends every scrape: one connection, not one per reading,
    and no delayed-ACK stall on the reused one (a separate header and body write, Nagle on)."""
    backend.pages["/metrics"] = Page(IDLE_PAGE)

    def twenty_readings(client: Client) -> float:
        async def twenty():  # on one loop: a connection is its loop's
            try:
                for _ in range(20):
                    assert (await client.request("GET", backend.url + "/metrics", deadline=Deadline.after(2))).status == OK
            finally:
                client.close()
        started = time.monotonic()
        asyncio.run(twenty())
        return time.monotonic() - started

    fresh = twenty_readings(Client(max_idle=0))  # the baseline: a new connection per reading, no stall
    connections = backend.connections
    reused = twenty_readings(Client())
    assert backend.connections - connections == 1
    # A delayed-ACK stall costs ~40 ms per reading (0.8 s for 20). A fresh connection is never
    # told to acknowledge at once (the kernel does so by itself for a new connection's first
    # segments); a reused one is.
    assert fresh < 20 * 0.025, f"20 fresh readings took {fresh:.2f}s: a delayed-ACK stall per reading?"
    assert reused < 3 * fresh + 20 * 0.010, \
        f"20 reused readings took {reused:.2f}s, 20 fresh ones {fresh:.2f}s: a delayed-ACK stall per reading?"


# -- rejected is not failed ------------------------------------------------------------------------

@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 422, 429])
def test_a_probe_refused_with_any_4xx_never_makes_an_idle_server_hung(backend, status):
    idle_vllm(backend, models=status, completions=status, embeddings=status)
    for _ in range(3):
        result = check(backend.url, interval=0.01, timeout=2)
        assert (result.verdict.state, result.exit_code) == ("idle", 0), result.verdict.reason
        assert result.last_probe.rejected and f"HTTP {status}" in result.verdict.reason


def test_a_keyed_server_without_the_key_says_what_to_do(backend):
    idle_vllm(backend, models=401, completions=401, embeddings=401)
    result = check(backend.url, interval=0.01, timeout=2)
    assert "give hangwatch the server's API key" in result.verdict.reason
    assert result.as_json()["probe"]["outcome"] == "rejected"


def test_the_api_key_goes_to_every_request_of_the_target_and_nowhere_in_the_output(backend, tmp_path):
    idle_vllm(backend)
    key = "sk-hangwatch-test-0123456789abcdef"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", backend.url, "--api-key-file", str(key_file),
                           "--json", "-v"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "idle"
    assert {auth for _, _, _, auth in backend.sent} == {f"Bearer {key}"}
    assert key not in done.stdout + done.stderr


@pytest.mark.parametrize("content", ["", "\n", "two words\n"])
def test_an_unusable_api_key_file_is_a_usage_error_naming_the_flag(tmp_path, content):
    key_file = tmp_path / "key"
    key_file.write_text(content)
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", "http://127.0.0.1:9", "--api-key-file",
                           str(key_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 64 and "--api-key-file" in done.stderr
    assert "two" not in done.stderr  # the file's content is never shown


def test_a_missing_api_key_file_is_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", "http://127.0.0.1:9", "--api-key-file",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 64 and "--api-key-file: cannot read" in done.stderr


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_probe_answered_with_5xx_failed_and_twice_is_hung(backend, status):
    idle_vllm(backend, completions=status)
    result = check(backend.url, interval=0.01, timeout=2)
    assert (result.verdict.state, result.exit_code) == ("hung", 1)
    assert all(o.probe.failed for o in result.observations)


# -- what the probe asks follows the model ----------------------------------------------------------

def test_auto_probes_a_pooling_model_with_one_embedding(backend):
    """vLLM 0.32 serving an embedding model has no /v1/completions route: 404 (measured)."""
    idle_vllm(backend, completions=404)
    result = check(backend.url, interval=0.01, timeout=2)
    assert (result.verdict.state, result.last_probe.kind, result.last_probe.outcome) == ("idle", "embedding", "answered")
    assert [p for _, p, _, _ in backend.sent] == ["/metrics", "/metrics", "/v1/models", "/v1/completions",
                                                  "/v1/embeddings"]
    assert backend.sent[-1][2] == {"model": "tiny-llama", "input": "ping"}


def test_auto_never_falls_back_to_embeddings_for_a_generative_model(backend):
    idle_vllm(backend)
    check(backend.url, interval=0.01, timeout=2)
    assert "/v1/embeddings" not in [p for _, p, _, _ in backend.sent]


def test_probe_embedding_asks_only_for_an_embedding(backend):
    idle_vllm(backend)
    result = check(backend.url, interval=0.01, timeout=2, probe="embedding")
    assert result.last_probe.kind == "embedding" and result.verdict.state == "idle"
    assert "/v1/completions" not in [p for _, p, _, _ in backend.sent]


def test_probe_none_sends_nothing_but_the_metrics_read(backend):
    idle_vllm(backend, completions=500)
    result = check(backend.url, interval=0.01, timeout=2, probe="none")
    assert (result.verdict.state, result.probe_sent) == ("idle", False)
    assert {p for _, p, _, _ in backend.sent} == {"/metrics"}


def test_exporter_sends_the_configured_key_and_probe_kind_per_target(backend, tmp_path, exporters):
    from hangwatch.exporter.config import exporter_config
    idle_vllm(backend)
    (tmp_path / "key").write_text("sk-exporter-0123456789\n")
    config = exporter_config({"targets": [{"url": backend.url, "api_key_file": str(tmp_path / "key"),
                                           "probe": "embedding"}]})
    _, url = exporters(config)
    got = samples(probe(url, backend.url).text)
    other = probe(url, backend.url.replace("127.0.0.1", "localhost"))  # not configured: no key
    assert got[("hangwatch_probe_success", ())] == 1 and got[("hangwatch_probe_rejected", ())] == 0
    paths = [(p, auth) for _, p, _, auth in backend.sent]
    assert ("/v1/embeddings", "Bearer sk-exporter-0123456789") in paths
    assert "/v1/completions" in [p for p, auth in paths if auth is None]  # the other URL: auto, no key
    assert "sk-exporter" not in other.text


def test_exporter_exposes_a_rejected_probe_and_not_a_failed_one(backend, exporters):
    idle_vllm(backend, models=401)
    _, url = exporters()
    got = samples(probe(url, backend.url).text)
    assert got[("hangwatch_probe_rejected", ())] == 1
    assert got[("hangwatch_probe_failed", ())] == 0
    assert got[("hangwatch_probe_success", ())] == 0


def test_an_exporter_api_key_file_that_cannot_be_read_names_the_key(tmp_path):
    from hangwatch.exporter.config import ConfigError, exporter_config
    with pytest.raises(ConfigError, match=r"^targets\[0\]\.api_key_file: cannot read"):
        exporter_config({"targets": [{"url": "http://a:1", "api_key_file": str(tmp_path / "missing")}]})
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match=r"^api_key_file: .* is empty"):
        exporter_config({"api_key_file": str(tmp_path / "empty")})
