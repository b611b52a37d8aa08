"""The HTTP client against hostile backends and names, on stock asyncio and on uvloop.

- an answer's head is bounded (64 KiB, 100 header lines) and so is a chunked body's framing (64 KiB
  beyond its data): a line that never ends is a broken answer, not a buffer that grows;
- one TLS context, reused (building one reads the system's CA store);
- name resolution and every address's connect happen inside the reading's one deadline;
- a host name that is no valid name (a 64-character label, ``a..b``) reads as down, never a 500.

Real sockets on 127.0.0.1, port 0. Where a resolver must misbehave (hang, or answer with
addresses of our choosing), the loop's ``getaddrinfo`` is replaced for that one name.
"""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest
import requests
import uvloop

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observation import OK, TIMEOUT, UNREACHABLE
from tests.exporter.test_probe_endpoint import samples
from tests.support.hostile import SocketServer
from tests.support.loops import run  # noqa: F401 (fixture)

CAP = 96 * 1024 * 1024  # the most a hostile server sends before it gives up (main read all of it)
FILL = b"a" * (1024 * 1024)
MAX_PEAK = 8 * 1024 * 1024  # what one bounded read may allocate, with room to spare
SLACK = 1.0

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
ENDLESS = {
    "trailer line": CHUNKED + b"5\r\nhello\r\n0\r\nX-Trailer: ",
    "chunk-size line": CHUNKED + b"0000",
    "header line": b"HTTP/1.1 200 OK\r\nX-Header: ",
    "status line": b"HTTP/1.1 200 ",
}

WHY = {  # how each endless line ends the reading ("aaa..." after "0000" overflows the chunk size)
    "trailer line": "chunked framing over 65536 bytes beyond its data",
    "chunk-size line": "Chunk size overflow",
    "header line": "answer head over 65536 bytes",
    "status line": "answer head over 65536 bytes",
}


class EndlessServer(SocketServer):
    """Answers every request with ``prefix`` and then ``FILL`` without a newline, until the
    client closes (or ``CAP`` bytes went out): a line that never ends."""

    def __init__(self, prefix: bytes):
        self.prefix = prefix
        self.sent = 0
        super().__init__(backlog=16)

    def _serve(self, conn):
        conn.settimeout(10)
        with conn:
            try:
                if self.read_head(conn) is None:
                    return
                conn.sendall(self.prefix)
                while self.sent < CAP and not self._stop.is_set():
                    conn.sendall(FILL)
                    self.sent += len(FILL)
            except OSError:
                pass  # the client closed: what we want


@pytest.fixture
def endless():
    servers = []

    def make(prefix: bytes) -> EndlessServer:
        server = EndlessServer(prefix)
        servers.append(server)
        return server
    yield make
    for server in servers:
        server.stop()


def get(run, url: str, deadline: Deadline):  # noqa: F811
    return run(Client(max_idle=0).request("GET", url, deadline=deadline))


def peak_while(read):
    """(what ``read()`` returned, the most Python memory it held at once)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = read()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- every line is bounded --------------------------------------------------------------------------
@pytest.mark.parametrize("line", sorted(ENDLESS))
def test_a_line_that_never_ends_is_a_broken_answer_read_in_bounded_memory(endless, line, run):  # noqa: F811
    server = endless(ENDLESS[line])
    started = time.monotonic()
    fetched, peak = peak_while(lambda: get(run, server.url + "/metrics", Deadline.after(20)))
    elapsed = time.monotonic() - started
    assert fetched.status not in (OK, TIMEOUT), fetched
    assert fetched.error.endswith(WHY[line]), fetched.error
    assert elapsed < 10, elapsed  # at the 64 KiB mark, not at the deadline (20 s, far from any load)
    assert peak < MAX_PEAK, f"{peak / 2**20:.1f} MiB held reading an endless {line}"


def test_an_endless_trailer_is_an_answer_broken_off(endless, run):  # noqa: F811
    server = endless(ENDLESS["trailer line"])
    fetched = get(run, server.url + "/metrics", Deadline.after(5))
    assert (fetched.status, fetched.http_status, fetched.body) == ("broken", 200, b"")
    assert fetched.error == "answer broken off: chunked framing over 65536 bytes beyond its data"


def answer_of(where: str, size: int) -> bytes:
    """An answer of ``size`` bytes beyond its 5 bytes of data ("hello"): its head when ``where``
    is "head" (a long header line), else its head and its chunked framing (a long chunk extension)."""
    if where == "head":
        start, end = b"HTTP/1.1 200 OK\r\nX: ", b"\r\nContent-Length: 5\r\n\r\n"
        return start + b"y" * (size - len(start) - len(end)) + end + b"hello"
    start, end = CHUNKED + b"5;x=", b"\r\nhello\r\n0\r\n\r\n"
    return start + b"y" * (size + 5 - len(start) - len(end)) + end


@pytest.mark.parametrize("where", ["head", "chunked framing"])
def test_a_head_or_framing_of_exactly_its_bound_is_read_one_byte_more_is_not(where, run):  # noqa: F811
    """A head may be 64 KiB; all that is not body data, head and chunked framing, 64 KiB + 64 KiB
    + the data's own size (5 bytes). One byte more is a broken answer."""
    bound = 65536 if where == "head" else 2 * 65536 + 5
    for size, ok in ((bound, True), (bound + 1, False)):
        server = EndlessOnce(answer_of(where, size))
        try:
            got = get(run, server.url + "/metrics", Deadline.after(5))
        finally:
            server.stop()
        assert (got.status == OK, got.body) == (ok, b"hello" if ok else b""), (size, got)


class EndlessOnce(SocketServer):
    """Answers with ``answer`` and closes."""

    def __init__(self, answer: bytes):
        self.answer = answer
        super().__init__(backlog=16)

    def _serve(self, conn):
        conn.settimeout(10)
        with conn:
            try:
                if self.read_head(conn) is not None:
                    conn.sendall(self.answer)
            except OSError:
                pass


def test_the_exporter_reads_an_endless_trailer_as_a_blind_page_in_bounded_memory(endless, exporters):
    """The busy-backend path (/metrics of an IP, read on the loop): the probe is answered at
    once, the page is unusable (``metrics_available 0``), and memory does not follow the backend."""
    server = endless(ENDLESS["trailer line"])
    _, url = exporters()
    started = time.monotonic()
    answer, peak = peak_while(lambda: requests.get(url + "/probe", params={"target": server.url}, timeout=30))
    elapsed = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    got = samples(answer.text)
    assert got[("hangwatch_metrics_available", ())] == 0
    assert elapsed < 5, elapsed
    assert peak < 2 * MAX_PEAK, f"{peak / 2**20:.1f} MiB"
    assert server.sent < CAP


# -- TLS: one context --------------------------------------------------------------------------------
class TLSServer(SocketServer):
    """Completes a TLS handshake (a certificate the client cannot verify) and closes."""

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        super().__init__(backlog=16)
        self.url = self.url.replace("http://", "https://")

    def _serve(self, conn):
        conn.settimeout(5)
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1024)
        except (OSError, ssl.SSLError):
            pass


@pytest.fixture
def tls_server(tmp_path):
    from tests.webhook.certs import make_certs
    certs = make_certs(tmp_path / "certs")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    server = TLSServer(context)
    yield server
    server.stop()


def test_every_https_connection_uses_one_tls_context(tls_server, monkeypatch, run):  # noqa: F811
    contexts = []  # the contexts themselves (held, so no id is reused)
    wrap = ssl.SSLContext.wrap_bio

    def recording(self, *args, **kwargs):
        if not kwargs.get("server_side"):
            contexts.append(self)
        return wrap(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "wrap_bio", recording)
    client = Client(max_idle=0)  # a fresh connection, so a handshake, every time

    async def four():
        return [await client.request("GET", tls_server.url + "/metrics", deadline=Deadline.after(5)) for _ in range(4)]
    results = run(four())
    assert all(r.status == UNREACHABLE and "certificate" in r.error for r in results), results
    assert len(contexts) == 4 and len({id(c) for c in contexts}) == 1
    other = get(run, tls_server.url + "/metrics", Deadline.after(5))
    assert other.status == UNREACHABLE and contexts[-1] is contexts[0]  # one per process, not per client


# -- resolution and connects inside the deadline -----------------------------------------------------
def resolving(monkeypatch, name: str, answer):
    """The loop's ``getaddrinfo`` (stock asyncio's and uvloop's) answers ``await answer(loop, port)``
    for ``name``, the real lookup otherwise."""
    for cls in (asyncio.BaseEventLoop, uvloop.Loop):
        real = cls.getaddrinfo

        async def getaddrinfo(self, host, port, *args, _real=real, **kwargs):
            if host == name:
                return await answer(self, port)
            return await _real(self, host, port, *args, **kwargs)
        monkeypatch.setattr(cls, "getaddrinfo", getaddrinfo)


def test_a_resolver_that_hangs_does_not_stretch_the_deadline(monkeypatch, run):  # noqa: F811
    release = threading.Event()
    resolving(monkeypatch, "hangs.test", lambda loop, port: loop.run_in_executor(None, release.wait, 10))

    async def timed():
        started = time.monotonic()
        fetched = await Client(max_idle=0).request("GET", "http://hangs.test:8000/metrics", deadline=Deadline.after(0.5))
        release.set()  # (else the loop's close waits for its executor)
        return fetched, time.monotonic() - started
    try:
        fetched, elapsed = run(timed())
    finally:
        release.set()
    assert fetched.status == UNREACHABLE and "resolving 'hangs.test'" in fetched.error, fetched
    assert elapsed < 0.5 + SLACK, elapsed


@pytest.fixture
def silent_address():
    """An address whose connect never completes: a listener whose accept queue is full (Linux
    drops the SYN), like a host that is down behind a firewall."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    held = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(listener.getsockname())
        held.append(sock)
    probe = socket.socket()
    probe.settimeout(0.3)
    with pytest.raises(TimeoutError):  # the setup itself: a connect here hangs
        probe.connect(listener.getsockname())
    probe.close()
    yield listener.getsockname()
    for sock in held:
        sock.close()
    listener.close()


def test_every_address_is_tried_within_the_one_deadline(monkeypatch, silent_address, run):  # noqa: F811
    host, port = silent_address
    two = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, port))] * 2

    async def answer(loop, port):
        return two
    resolving(monkeypatch, "two-silent.test", answer)
    started = time.monotonic()
    fetched = get(run, f"http://two-silent.test:{port}/metrics", Deadline.after(1.0))
    elapsed = time.monotonic() - started
    assert fetched.status == UNREACHABLE, fetched
    assert elapsed < 1.0 + 0.5, elapsed  # main gave each address the whole budget: 2 s


# -- invalid host names are down, never a 500 ---------------------------------------------------------
BAD_NAMES = ["a" * 64 + ".example", "a..b", "-" * 300]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["64-char-label", "empty-label", "300-dashes"])
def test_an_invalid_host_name_is_a_failed_reading_with_a_reason(name, run):  # noqa: F811
    fetched = get(run, f"http://{name}:8000/metrics", Deadline.after(2))
    assert fetched.status == UNREACHABLE and "not a valid host name" in fetched.error, fetched


@pytest.mark.parametrize("name", BAD_NAMES[:2], ids=["64-char-label", "empty-label"])
def test_the_exporter_reads_an_invalid_host_name_as_down(name, exporters):
    _, url = exporters()
    answer = requests.get(url + "/probe", params={"target": f"http://{name}:8000"}, timeout=30)
    health = requests.get(url + "/livez", params={"target": f"http://{name}:8000"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert samples(answer.text)[("hangwatch_up", ())] == 0
    assert health.status_code == 200 and health.json()["verdict"] == "down", health.text


def test_hangwatch_check_says_why_an_invalid_host_name_is_down():
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", "http://a..b:8000", "--json",
                           "--timeout", "1"], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "down" and "not a valid host name" in json.dumps(result), result


class TLSPageServer(SocketServer):
    """Answers ``hello`` over TLS, keep-alive: a backend behind HTTPS."""

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        self.connections = 0
        super().__init__(backlog=16)
        self.url = self.url.replace("http://", "https://")

    def _serve(self, conn):
        conn.settimeout(5)
        self.connections += 1
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                while self.read_head(tls) is not None:
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
        except (OSError, ssl.SSLError):
            pass


def test_an_https_backend_is_read_and_its_connection_kept(tmp_path, monkeypatch, run):  # noqa: F811
    """The handshake and every read on the loop (the loop's own TLS transport), the server's
    certificate checked against the trusted CAs, and the connection reused like a plain one."""
    from tests.webhook.certs import make_certs
    certs = make_certs(tmp_path / "certs")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    server = TLSPageServer(context)
    trusting = ssl.create_default_context(cafile=str(certs.ca))
    monkeypatch.setattr("hangwatch.connect.tls_context", lambda: trusting)
    client = Client()

    async def three():
        return [await client.request("GET", server.url + "/metrics", deadline=Deadline.after(5)) for _ in range(3)]
    try:
        results = run(three())
    finally:
        client.close()
        server.stop()
    assert [(r.status, r.body, r.content_type) for r in results] == [(OK, b"hello", "text/plain")] * 3, results
    assert server.connections == 1
