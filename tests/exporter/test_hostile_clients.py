"""The exporter's own HTTP server against hostile clients: request smuggling shapes and other heads
RFC 9112 says a server MUST reject, targets that could raise past the connection, one address
holding the whole connection table, 20,000 distinct heads, and synchronous answers queued behind
the only work slot. Each must cost the attacker's own connection at most.
"""
from __future__ import annotations

import asyncio
import logging
import re
import resource
import selectors
import socket
import threading
import time

import pytest
import requests

from hangwatch.exporter.config import ExporterConfig
from hangwatch.exporter.httpserver import BoundedHTTPServer, Response, Route
from hangwatch.simulator import Simulator
from tests.support.pages import Page, PageServer
from tests.support.servers import ServerProcess
from tests.test_reading import VLLM_TWO_ENGINES


@pytest.fixture
def exporter_with(exporters):
    """``exporter_with(**config) -> (server, port)``."""
    def start(**config):
        server, url = exporters(ExporterConfig(**config))
        return server, int(url.rsplit(":", 1)[1])
    return start


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data``, half-close, and read until the exporter closes (one deadline)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"^HTTP/1\.1 (\d{3}) ", answer, flags=re.M)]


def raise_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"this test needs {needed} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


# -- RFC 9112: what a server MUST reject -----------------------------------------------------------
SMUGGLED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"  # 34 bytes
GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
MUST_REJECT = {
    # two different lengths: the "body" would be answered as a second request (smuggling)
    "two_content_lengths": GET_METRICS + b"Content-Length: 0\r\nContent-Length: 34\r\n\r\n" + SMUGGLED,
    "two_content_lengths_last_zero": GET_METRICS + b"Content-Length: 34\r\nContent-Length: 0\r\n\r\n" + SMUGGLED,
    "length_and_chunked": GET_METRICS + b"Content-Length: 34\r\nTransfer-Encoding: chunked\r\n\r\n" + SMUGGLED,
    "chunked_not_last": b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n" + SMUGGLED,
    "space_before_colon": b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length : 34\r\n\r\n" + SMUGGLED,
    "nul_in_value": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "cr_in_value": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
    "no_host_on_1_1": b"GET /metrics HTTP/1.1\r\n\r\n",
    "two_hosts": b"GET /metrics HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    "http_1_9": b"GET /metrics HTTP/1.9\r\nHost: x\r\n\r\n",
    "http_2_0": b"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n",
    "not_http": b"GET /metrics RTSP/1.0\r\nHost: x\r\n\r\n",
    "obs_fold": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    "bare_lf": b"GET /metrics HTTP/1.1\nHost: x\n\n",
    "two_spaces": b"GET  /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "body_on_get": b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 34\r\n\r\n" + SMUGGLED,
    "chunked_body_on_get": b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n22\r\n" + SMUGGLED
                           + b"\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MUST_REJECT))
def test_heads_rfc_9112_says_to_reject_get_one_400_and_a_close(exporter_with, name):
    _, port = exporter_with()
    answer = exchange(port, MUST_REJECT[name])
    assert statuses(answer) == [400], answer[:300]
    assert b"Connection: close" in answer


def test_a_failing_route_is_one_500_and_one_log_line(caplog):
    def broken(request):
        raise RuntimeError("a bug in a route")
    server = BoundedHTTPServer(("127.0.0.1", 0), {"/broken": Route(broken, inline=True)})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with caplog.at_level(logging.INFO, logger="hangwatch.exporter"):
            answer = exchange(server.server_address[1], b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        server.shutdown()
        server.server_close()
    assert statuses(answer) == [500]
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(failed) == 1 and "a bug in a route" in failed[0].getMessage()
    assert failed[0].exc_info is None, "a traceback per request lets a client fill the log"


@pytest.mark.parametrize("target", [b"//[x", b"//[::1", b"/%zz", b"*", b"example.com:80", b"/a#b", b"http://[x"])
def test_odd_targets_are_answered_and_nothing_is_logged(exporter_with, caplog, target):
    """``GET //[x`` raised ValueError from urlsplit past the connection: a traceback and no answer."""
    _, port = exporter_with()
    with caplog.at_level(logging.INFO):
        answer = exchange(port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(statuses(answer)) == 1 and statuses(answer)[0] in (200, 400, 404), answer[:200]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_absolute_form_target_is_routed_by_its_path(exporter_with):
    _, port = exporter_with()
    answer = exchange(port, b"GET http://exporter.example:9400/metrics HTTP/1.1\r\nHost: exporter.example\r\n\r\n")
    assert statuses(answer) == [200] and b"hangwatch_exporter_connections_open" in answer


def test_head_is_answered_with_the_headers_of_get_and_no_body(exporter_with):
    _, port = exporter_with()
    get = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    # HEAD, then GET on the same connection: any body after HEAD's head would be read as the
    # start of the second answer.
    both = exchange(port, b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    length = re.search(rb"Content-Length: (\d+)", get).group(1)
    head_answer, _, rest = both.partition(b"\r\n\r\n")
    assert head_answer.startswith(b"HTTP/1.1 200") and b"Content-Length: " + length in head_answer
    assert rest.startswith(b"HTTP/1.1 200"), rest[:100]
    assert rest.partition(b"\r\n\r\n")[2] == get.partition(b"\r\n\r\n")[2]


def test_other_methods_are_405_naming_get_and_head(exporter_with):
    _, port = exporter_with()
    answer = exchange(port, b"OPTIONS /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(answer) == [405] and b"Allow: GET, HEAD" in answer


# -- no client starves another ------------------------------------------------------------------------
ATTACKER = "127.0.0.2"  # another address on loopback: the attacker is one peer, the kubelet another
HOLD, PIPELINED = 1030, 20


def test_one_address_holding_every_connection_does_not_starve_the_others(exporter_with):
    """1,030 connections from one address, each pipelining 20 /livez: on main every slot was
    busy and nothing evictable, so 30 of 30 new connections (a kubelet's liveness probe among
    them) were refused. Now that address gives way: the others are answered."""
    raise_descriptor_limit(2 * HOLD + 512)
    sim = Simulator().start()
    server, port = exporter_with()
    attackers: list[socket.socket] = []
    try:
        request = (f"GET /livez?target={sim.url} HTTP/1.1\r\nHost: x\r\n\r\n" * PIPELINED).encode()
        deadline = time.monotonic() + 60
        for _ in range(HOLD):
            assert time.monotonic() < deadline, "could not open the attacker's connections"
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((ATTACKER, 0))
            sock.settimeout(10)
            try:
                sock.connect(("127.0.0.1", port))
                sock.sendall(request)
            except OSError:
                sock.close()  # refused once the table is full: the attacker goes on
                continue
            attackers.append(sock)
        # The attack holds: the table is full of the attacker's waiting /livez.
        while server.stats.connections_open < 1000 or server.stats.work_running < 10:
            assert time.monotonic() < deadline, (server.stats.connections_open, server.stats.work_running)
            time.sleep(0.05)

        answers: list[int] = []

        def ask(path: str) -> None:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}{path}", timeout=20, headers={"Connection": "close"})
            except requests.RequestException:
                answers.append(0)
                return
            # /livez says 200 when no worker is free too ("not a verdict"): that is no answer here
            answers.append(-1 if b"overloaded" in answer.content else answer.status_code)
        paths = ["/metrics", f"/livez?target={sim.url}", f"/readyz?target={sim.url}"] * 10
        askers = [threading.Thread(target=ask, args=(path,)) for path in paths]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(30)
        assert server.stats.connections_open >= 900, "the attack ended before the others asked"
    finally:
        for sock in attackers:
            sock.close()
        sim.stop()
    assert len(answers) == len(paths)
    assert answers.count(200) >= 0.9 * len(paths), answers


def test_a_full_table_makes_room_from_the_address_holding_most(caplog):
    """Small and exact: one address fills the table with requests in flight (nothing idle, so
    nothing was evictable on main and every newcomer was refused); its own next connection is
    refused, another address's connections are answered, each one taking a connection from it."""
    async def never(request):
        await asyncio.Event().wait()  # work that holds its connection busy for good
    routes = {"/hold": Route(never, start_within=lambda request: 60.0),
              "/ok": Route(lambda request: Response(200, "text/plain", b"ok\n"), inline=True)}
    server = BoundedHTTPServer(("127.0.0.1", 0), routes, max_connections=16)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    held: list[socket.socket] = []
    try:
        for _ in range(server.max_client_connections):
            sock = socket.socket()
            sock.bind((ATTACKER, 0))
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(sock)
        deadline = time.monotonic() + 10
        while server.stats.work_running < server.max_client_connections:
            assert time.monotonic() < deadline, server.stats
            time.sleep(0.02)
        one_more = socket.socket()
        one_more.bind((ATTACKER, 0))
        one_more.connect(("127.0.0.1", port))
        held.append(one_more)
        one_more.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        one_more.settimeout(5)
        try:
            refused = one_more.recv(100) == b""
        except ConnectionResetError:
            refused = True
        assert refused, "the address holding the most got yet another connection"
        others = []
        for _ in range(5):  # kept open (keep-alive): the table is full from the second one on
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(sock)
            sock.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            others.append(sock.recv(1000))
        assert [statuses(answer) for answer in others] == [[200]] * 5
        assert server.stats.dropped["evicted"] >= 4 and server.stats.dropped["refused"] >= 1
    finally:
        for sock in held:
            sock.close()
        server.shutdown()
        server.server_close()


# -- memory ----------------------------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def test_twenty_thousand_distinct_heads_do_not_grow_memory():
    """Each ~1 KB head on an unknown path was kept parsed (27 -> 344 MiB on main, and there it
    stayed): the exporter's 256 Mi limit in the manifests OOM-killed it."""
    with ServerProcess("exporter") as exporter:
        pid = exporter.process.pid
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as sock:
            def batch(first: int, count: int) -> None:
                padding = "x" * 940
                sock.sendall("".join(f"GET /nope-{i:06d}-{padding} HTTP/1.1\r\nHost: x\r\n\r\n"
                                     for i in range(first, first + count)).encode())
                received = b""
                deadline = time.monotonic() + 20
                while received.count(b"HTTP/1.1 404") < count:
                    assert time.monotonic() < deadline, "the exporter stopped answering"
                    chunk = sock.recv(65536)
                    assert chunk, "the exporter closed the connection"
                    received += chunk
            batch(0, 500)  # warm: the first requests allocate what every request reuses
            before = rss_mib(pid)
            for first in range(500, 20500, 500):
                batch(first, 500)
            after = rss_mib(pid)
        exporter.stop()
    assert after - before < 8, f"RSS {before:.1f} -> {after:.1f} MiB"


def test_only_heads_answered_200_are_kept_and_only_so_many_bytes(monkeypatch):
    """Prometheus' same head every scrape is parsed once; a head on an unknown path or refused
    by its route is never kept, and all kept heads fit KEPT_HEADS_BYTES."""
    from hangwatch.exporter import admission
    monkeypatch.setattr(admission, "KEPT_HEADS_BYTES", 20 * (100 + admission.KEPT_HEAD_OVERHEAD))
    routes = {"/ok": Route(lambda request: Response(200 if request.query != "bad" else 400, "text/plain", b".\n"),
                           inline=True)}
    server = BoundedHTTPServer(("127.0.0.1", 0), routes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        heads = [f"GET /ok?{i:04d} HTTP/1.1\r\nHost: x\r\n\r\n" for i in range(100)]
        heads += [f"GET /nope{i} HTTP/1.1\r\nHost: x\r\n\r\n" for i in range(100)]
        heads += ["GET /ok?bad HTTP/1.1\r\nHost: x\r\n\r\n"]
        answer = exchange(port, "".join(heads).encode())
        assert len(statuses(answer)) == len(heads)
        kept = list(server.admission.heads.kept)
        assert kept and all(head.startswith(b"GET /ok?0") for head in kept), kept[:3]
        assert 0 < server.admission.heads.bytes <= admission.KEPT_HEADS_BYTES
        assert kept[-1].startswith(b"GET /ok?0099")  # the newest stay, the oldest went
    finally:
        server.shutdown()
        server.server_close()


# -- work slots are never lost ---------------------------------------------------------------------------
def close_wait_sockets(port: int) -> int:
    """Sockets of this local port in CLOSE_WAIT (the peer closed, the exporter did not)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "08":
                        count += 1
        except FileNotFoundError:
            continue
    return count


def test_bad_probes_queued_behind_a_busy_slot_are_all_answered_and_the_slot_comes_back(exporter_with):
    """600 bad /probe waiting behind the only slot: each answered at once when the slot frees,
    each answer giving the slot to the next. On main every answer re-entered the queue from
    inside the last one, the recursion broke half-way, requests went unanswered, the slot was
    never returned (every later probe 503) and the sockets sat in CLOSE_WAIT."""
    count = 600
    raise_descriptor_limit(2 * count + 512)
    stalled, healthy = PageServer(), PageServer()
    stalled.pages["/metrics"] = Page(silent=True)
    healthy.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    server, port = exporter_with(max_concurrent_probes=1, timeout_offset=0.0)
    waiting: list[socket.socket] = []
    try:
        stuck = threading.Thread(target=requests.get, args=(f"http://127.0.0.1:{port}/probe",), kwargs={
            "params": {"target": stalled.url}, "timeout": 20,
            "headers": {"X-Prometheus-Scrape-Timeout-Seconds": "3"}}, daemon=True)
        stuck.start()
        deadline = time.monotonic() + 30
        while server.stats.work_running < 1:
            assert time.monotonic() < deadline, "the stuck probe never started"
            time.sleep(0.02)
        bad = (b"GET /probe?target=not-a-url HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"X-Prometheus-Scrape-Timeout-Seconds: 20\r\n\r\n")
        selector = selectors.DefaultSelector()
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(bad)
            sock.setblocking(False)
            waiting.append(sock)
            selector.register(sock, selectors.EVENT_READ, bytearray())
        assert server.stats.work_running == 1, "the stuck probe ended before the bad ones queued"
        answered: dict[socket.socket, bytes] = {}
        while len(answered) < count and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                try:
                    chunk = key.fileobj.recv(65536)
                except (BlockingIOError, ConnectionResetError):
                    chunk = b""
                key.data.extend(chunk)
                if not chunk:  # the exporter closed it: the answer (if any) is whole
                    selector.unregister(key.fileobj)
                    answered[key.fileobj] = bytes(key.data)
        selector.close()
        codes = [statuses(answer)[:1] for answer in answered.values()]
        assert len(answered) == count and codes.count([400]) == count, (len(answered), codes[:5])
        good = requests.get(f"http://127.0.0.1:{port}/probe", params={"target": healthy.url}, timeout=10)
        assert good.status_code == 200, "the slot never came back"
        stuck.join(20)
    finally:
        for sock in waiting:
            sock.close()
        stalled.stop()
        healthy.stop()
    deadline = time.monotonic() + 10
    while close_wait_sockets(port):
        assert time.monotonic() < deadline, f"{close_wait_sockets(port)} exporter sockets stay in CLOSE_WAIT"
        time.sleep(0.1)
