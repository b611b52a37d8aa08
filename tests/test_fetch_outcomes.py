"""Every way a fetch can end, on a real socket, pinned to the observation it becomes.

How a request fails is itself the reading (``hangwatch.fetch``): refused is down (perhaps
loading weights), accepted-but-silent is the wedge that turns hung when it repeats, a page too
large or broken off is blind. Each ending is produced here by a real server (or a real
absence of one) and read both ways production reads a backend's /metrics: the thread-side
``Client`` through ``observe_backend`` (``hangwatch check``, the re-check, ``/livez``), and the
exporter's ``LoopClient`` on its own loop (``exporter.evloop``) through ``metrics_observation``.
"""
from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observation import BLIND, REFUSED, TIMEOUT, UNREACHABLE, Options
from hangwatch.observe import metrics_observation, observe_backend
from hangwatch.verdict import judge
from harness.ports import closed_port
from tests.exporter.test_reads_on_the_loop import loop_client, loop_get  # noqa: F401 (fixture)
from tests.support.hostile import SocketServer
from tests.support.pages import Page, PageServer

DEADLINE = 1.0


class EndingServer(SocketServer):
    """Reads a request's head, then ends the connection as ``ending`` says."""

    def __init__(self, ending: str):
        self.ending = ending
        super().__init__(backlog=16)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                if self.read_head(conn) is None:
                    return
                if self.ending == "silent":
                    self._stop.wait(10)
                elif self.ending == "reset_mid_answer":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
                                 b"vllm:num_requests_running 0\n")
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                # "closed": nothing at all, then the close
            except OSError:
                pass


@pytest.fixture
def ending():
    made = []

    def start(kind: str) -> str:
        server = EndingServer(kind)
        made.append(server)
        return server.url
    yield start
    for server in made:
        server.stop()


@pytest.fixture
def too_large():
    server = PageServer()
    server.pages["/metrics"] = Page(chunks=(b"# " + b"x" * 65534 + b"\n" for _ in range(200)))  # ~13 MB
    yield server.url
    server.stop()


def threaded(url: str):
    client = Client()
    try:
        return asyncio.run(observe_backend(client, url, Deadline.after(DEADLINE), Options(engine="vllm")))
    finally:
        client.close()


def on_the_loop(loop_client, url: str):  # noqa: F811
    fetched = loop_get(loop_client, url + "/metrics", Deadline.after(DEADLINE))
    return metrics_observation(0.0, fetched, Options(engine="vllm"))


# (status, the verdict of that one observation)
EXPECTED = {
    "refused": (REFUSED, "down"),
    "silent": (TIMEOUT, "down"),          # once; twice in a row is hung (test_verdict, the truth table)
    "closed": (UNREACHABLE, "down"),
    "reset_mid_answer": (BLIND, "blind"),
    "too_large": (BLIND, "blind"),
}


def url_for(kind: str, ending, too_large) -> str:  # noqa: F811
    if kind == "refused":
        return f"http://127.0.0.1:{closed_port()}"
    if kind == "too_large":
        return too_large
    return ending(kind)


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_each_ending_on_a_thread(kind, ending, too_large):  # noqa: F811
    observation = threaded(url_for(kind, ending, too_large))
    assert (observation.status, judge([observation]).state) == EXPECTED[kind], observation
    assert observation.reading is None and observation.probe is None


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_each_ending_on_the_exporters_loop(kind, ending, too_large, loop_client):  # noqa: F811
    observation = on_the_loop(loop_client, url_for(kind, ending, too_large))
    assert (observation.status, judge([observation]).state) == EXPECTED[kind], observation
    assert observation.reading is None


def test_a_tls_handshake_that_fails_is_unreachable(ending):
    """https:// to a server that speaks plain HTTP (or a certificate that does not verify):
    no HTTP answer at all, so down — never a reading."""
    server = PageServer()
    try:
        observation = threaded(server.url.replace("http://", "https://"))
    finally:
        server.stop()
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation


def test_a_name_that_does_not_resolve_is_unreachable():
    observation = threaded("http://no-such-backend.invalid:8000")  # .invalid never resolves (RFC 6761)
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation


def test_a_fetch_and_an_observation_speak_one_set_of_status_names():
    """One definition (``hangwatch.observation``): a fetch's ending that is no answer becomes an
    observation of the same name (a connection closed without an answer is unreachable), with no
    table in between that could drift from either side."""
    from hangwatch import fetch, observation
    from hangwatch.fetch import Fetched
    from hangwatch.observe import not_answered

    for name in ("OK", "REFUSED", "UNREACHABLE", "TIMEOUT", "HTTP_ERROR", "TOO_LARGE", "BROKEN"):
        assert getattr(fetch, name) is getattr(observation, name), name
    assert not hasattr(observation, "ANSWERED")
    for status in (REFUSED, UNREACHABLE, TIMEOUT):
        assert not_answered(0.0, Fetched(status, error="x"), "/metrics").status == status
    assert not_answered(0.0, Fetched(fetch.BROKEN, error="x"), "/metrics").status == UNREACHABLE
    assert not_answered(0.0, Fetched(fetch.TOO_LARGE, error="x"), "/metrics").status == BLIND
    assert not_answered(0.0, Fetched(fetch.OK), "/metrics") is None
