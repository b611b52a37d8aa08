"""``hangwatch.exporter.loopfetch`` reads a backend on the event loop exactly as ``fetch.Client`` does on a
thread: the same ending for every answer a server can give (compared byte for byte on raw
answers), the same single deadline against servers that drip, and keep-alive reuse. Run on the
loop the exporter runs it on (``exporter.evloop``), not asyncio's: the two differ in exactly the
places a transport leans on (readers, writers, timers)."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from hangwatch.demo.wait import wait_until
from hangwatch.exporter.evloop import Loop
from hangwatch.exporter.loopfetch import LoopClient
from hangwatch.fetch import OK, REFUSED, TIMEOUT, Client, Deadline
from tests.support.hostile import HostileServer, SocketServer
from tests.support.pages import Page, PageServer

IDLE_PAGE = (Path(__file__).parents[1] / "data" / "vllm-0.32" / "idle.prom").read_bytes()
SLACK = 2.0  # a bound that is the feature (the deadline), generously: a loaded two-core machine


class RawServer(SocketServer):
    """Answers every request with ``answer`` (bytes, written in ``pieces``), then closes or keeps
    the connection open for ``hold`` seconds."""

    def __init__(self, answer: bytes, *, close: bool = True, hold: float = 0.0, pieces: int = 1):
        self.answer, self.close, self.hold, self.pieces = answer, close, hold, pieces
        super().__init__(backlog=16)

    def _serve(self, conn):
        conn.settimeout(5)
        with conn:
            try:
                if self.read_head(conn) is None:
                    return
                step = max(1, len(self.answer) // self.pieces)
                for start in range(0, len(self.answer), step):
                    conn.sendall(self.answer[start:start + step])
                    if self.pieces > 1:
                        time.sleep(0.01)
                if not self.close:
                    self._stop.wait(self.hold)
            except OSError:
                pass


@pytest.fixture
def loop_client():
    loop = Loop()
    client = LoopClient(loop)
    yield client
    client.close()
    loop.close()


def loop_get(client: LoopClient, url: str, deadline: Deadline, **kwargs):
    """One GET on the loop, run until its ``done`` is called (or a safety stop 5 s after the
    deadline: a GET that never calls back fails the test instead of hanging it)."""
    loop, got = client.loop, []

    def done(fetched):
        got.append(fetched)
        loop.stop()
    safety = loop.call_later(max(0.1, deadline.left()) + 5, loop.stop)
    loop.call_soon(lambda: client.get(url, deadline, done, **kwargs))
    loop.run_forever()
    safety.cancel()
    assert len(got) == 1, f"the GET called back {len(got)} times"
    return got[0]


def blocking_get(url: str, deadline: Deadline, **kwargs):
    return Client(max_idle=0).request("GET", url, deadline=deadline, **kwargs)


PAGE = b"vllm:num_requests_running 1\n"
ANSWERS = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
        len(PAGE), PAGE),
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nvllm:\r\n"
               b"17\r\nnum_requests_running 1\n\r\n0\r\nX-Trailer: y\r\n\r\n",
    "read-to-close": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE,
    "http-1.0": b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE),
    "status-without-reason": b"HTTP/1.1 200\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE),
    "bare-newlines": b"HTTP/1.1 200 OK\nContent-Length: %d\n\n%s" % (len(PAGE), PAGE),
    "continue-first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (
        len(PAGE), PAGE),
    "no-content": b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n",
    "error-500": b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + b"e" * 5000,
    "error-404-small": b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
    "redirect": b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
    "short-body": b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + PAGE,
    "garbage-status": b"SSH-2.0-OpenSSH_9\r\n\r\n",
    "bad-status-code": b"HTTP/1.1 abc OK\r\n\r\n",
    "status-out-of-range": b"HTTP/1.1 42 Hm\r\n\r\n",
    "unknown-protocol": b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    "closed-without-answer": b"",
    "cut-in-status-line": b"HTTP/1.1 20",
    "cut-in-headers": b"HTTP/1.1 200 OK\r\nContent-Le",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "cut-in-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "too-many-headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(120))
                        + b"Content-Length: 0\r\n\r\n",
    "header-line-too-long": b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n",
    "trailer-line-too-long": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: "
                             + b"y" * 70000 + b"\r\n\r\n",
    "chunk-size-line-too-long": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=" + b"y" * 70000
                                + b"\r\nhello\r\n0\r\n\r\n",
    "negative-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n" + PAGE,
    "bad-length": b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n" + PAGE,
    "no-header-line": b"HTTP/1.1 200 OK\r\nNot a header\r\nContent-Length: 3\r\n\r\n" + PAGE,
    "big-page": b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + b"#" * 200000,
    "big-chunked-page": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + b"".join(b"%x\r\n%s\r\n" % (7000, b"#" * 7000) for _ in range(30)) + b"0\r\n\r\n",
}


def same(a, b):
    return (a.status, a.http_status, a.body, a.content_type) == (b.status, b.http_status, b.body, b.content_type)


@pytest.mark.parametrize("pieces", [1, 7])
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_every_answer_ends_as_the_blocking_client_ends_it(loop_client, name, pieces):
    server = RawServer(ANSWERS[name], pieces=pieces)
    try:
        expected = blocking_get(server.url + "/metrics", Deadline.after(3))
        got = loop_get(loop_client, server.url + "/metrics", Deadline.after(3))
    finally:
        server.stop()
    assert same(got, expected), (name, got, expected)


@pytest.mark.parametrize("name", ["big-page", "big-chunked-page", "error-500"])
def test_the_size_limit_is_checked_where_the_blocking_client_checks_it(loop_client, name):
    server = RawServer(ANSWERS[name])
    try:
        for limit in (1000, 65536, 131072, 150000, 10 ** 6):
            expected = blocking_get(server.url + "/metrics", Deadline.after(3), max_bytes=limit)
            got = loop_get(loop_client, server.url + "/metrics", Deadline.after(3), max_bytes=limit)
            assert same(got, expected), (limit, got, expected)
    finally:
        server.stop()


def test_a_closed_port_is_refused(loop_client):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    sock.close()
    assert loop_get(loop_client, url, Deadline.after(2)).status == REFUSED


def test_a_silent_server_is_a_timeout_at_the_deadline(loop_client):
    server = RawServer(b"", close=False, hold=10)
    try:
        started = time.monotonic()
        fetched = loop_get(loop_client, server.url + "/metrics", Deadline.after(0.5))
        took = time.monotonic() - started
    finally:
        server.stop()
    assert fetched.status == TIMEOUT and fetched.http_status is None and 0.45 <= took < 0.5 + SLACK


@pytest.mark.parametrize("mode", ["drip_headers", "drip_body", "slow_page"])
def test_a_dripping_answer_ends_at_the_deadline(loop_client, mode):
    server = HostileServer({"/metrics": mode}, body=IDLE_PAGE, gap=0.05, chunk=256)
    try:
        started = time.monotonic()
        fetched = loop_get(loop_client, server.url + "/metrics", Deadline.after(1.0))
        took = time.monotonic() - started
    finally:
        server.stop()
    assert fetched.status == TIMEOUT and took < 1.0 + SLACK, (fetched, took)


def test_no_time_left_sends_nothing(loop_client):
    server = HostileServer({})
    try:
        fetched = loop_get(loop_client, server.url + "/metrics", Deadline.after(-1))
    finally:
        server.stop()
    assert fetched.status == TIMEOUT and server.requests == []


def test_a_keepalive_connection_the_server_dropped_is_never_read_as_a_failure(loop_client):
    server = HostileServer({"/metrics": "keepalive_then_close"}, body=IDLE_PAGE, gap=0.05)
    try:
        for n in range(1, 4):
            fetched = loop_get(loop_client, server.url + "/metrics", Deadline.after(2))
            assert fetched.status == OK and fetched.body == IDLE_PAGE
            wait_until(lambda: server.closed == n, 5, f"the server to close idle connection {n}", interval=0.01)
    finally:
        server.stop()
    assert len(server.requests) == 3


def test_one_keepalive_connection_serves_reading_after_reading(loop_client):
    backend = PageServer()
    backend.pages["/metrics"] = Page(IDLE_PAGE)
    try:
        for _ in range(10):
            fetched = loop_get(loop_client, backend.url + "/metrics", Deadline.after(2),
                               headers={"Authorization": "Bearer k"})
            assert fetched.status == OK and fetched.body == IDLE_PAGE
        assert backend.connections == 1
    finally:
        backend.stop()


def test_a_reused_connection_reset_mid_answer_is_retried_once_fresh(loop_client):
    """Kept open after a first answer, then reset on the second request: asked again, fresh."""
    calls = []

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    answer = ANSWERS["content-length"]

    def serve():
        for _ in range(2):
            conn, _ = sock.accept()
            with conn:
                conn.recv(4096)
                calls.append("first" if not calls else "again")
                conn.sendall(answer)
                if len(calls) == 1:
                    conn.recv(4096)  # the second request on the kept connection: close without answer
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert loop_get(loop_client, url, Deadline.after(2)).status == OK
        fetched = loop_get(loop_client, url, Deadline.after(2))
    finally:
        thread.join(5)
        sock.close()
    assert fetched.status == OK and fetched.body == PAGE and calls == ["first", "again"]


def test_only_plain_http_to_an_address_is_read_on_the_loop():
    assert LoopClient.can_get("http://127.0.0.1:8000/metrics")
    assert LoopClient.can_get("http://[::1]:8000/metrics")
    assert not LoopClient.can_get("http://localhost:8000/metrics")   # needs a resolver
    assert not LoopClient.can_get("https://127.0.0.1:8000/metrics")  # needs a handshake
    assert not LoopClient.can_get("http://user:pw@127.0.0.1:8000/metrics")
    assert not LoopClient.can_get("http://127.0.0.1:99999/metrics")


def test_an_error_in_the_probe_after_the_read_is_a_500_not_a_hung_scrape(monkeypatch):
    """Whatever goes wrong after the backend was read, the scrape gets an answer and its slot back."""
    import requests

    from hangwatch.exporter import prober
    from hangwatch.exporter import server as exporter_server
    from hangwatch.exporter.config import ExporterConfig

    backend = PageServer()
    backend.pages["/metrics"] = Page(IDLE_PAGE)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(prober, "metrics_observation", broken)
    server = exporter_server.make_server("127.0.0.1:0", ExporterConfig(max_concurrent_probes=1))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/probe?target={backend.url}"
        for _ in range(2):  # the one slot came back: the second is answered too
            assert requests.get(url, timeout=5).status_code == 500
    finally:
        server.shutdown()
        server.server_close()
        backend.stop()
