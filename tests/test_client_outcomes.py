"""Every way a request can end, on a real socket, pinned to its outcome and its one message.

How a request fails is itself the reading (``hangwatch.client``): refused is down (perhaps
loading weights), accepted-but-silent is the wedge that turns hung when it repeats, a page too
large or broken off is blind. Each ending is produced by a real server (or a real absence of one),
on stock asyncio and on uvloop; the raw answers are sent whole and dripped a few bytes at a time.
The expected outcomes are what ``http.client`` made of each answer, but for a 103 Early Hints (it
returned the 103 as the answer; the final one is read now) and the four marked as changed; a
message where llhttp refuses an answer is llhttp's own.
"""
from __future__ import annotations

import re
import socket
import struct
import threading

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observation import BLIND, BROKEN, HTTP_ERROR, OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE, Options
from hangwatch.observe import observe_backend
from hangwatch.verdict import judge
from harness.ports import closed_port
from tests.support.hostile import SocketServer
from tests.support.loops import run  # noqa: F401 (fixture)
from tests.support.pages import Page, PageServer
from tests.support.raw_answers import ANSWERS, MAX_BYTES, PAGE, RawServer

DEADLINE = 1.0
CLOSED = "connection closed without an answer: Remote end closed connection without response"

# name -> (status, HTTP status, body, error, content type)
READ_AS = {
    "length": (OK, 200, PAGE, "", "text/plain"),
    "chunked": (OK, 200, PAGE, "", "text/plain"),
    "chunked-extension-and-trailer": (OK, 200, b"hello", "", "text/plain"),
    "read-to-close": (OK, 200, PAGE, "", "text/plain"),
    "http-1.1-no-length": (OK, 200, PAGE, "", ""),
    "bare-lf": (OK, 200, b"hello", "", "text/plain"),
    "no-reason": (OK, 200, b"hello", "", ""),
    "early-hints-then-200": (OK, 200, b"hello", "", ""),
    "continue-then-200": (OK, 200, b"hello", "", ""),
    "204-with-length": (OK, 204, b"", "", ""),
    "500-long-body": (HTTP_ERROR, 500, b"e" * 2048, "HTTP 500", ""),
    "404": (HTTP_ERROR, 404, b"{}", "HTTP 404", "application/json"),
    "short-length": (OK, 200, PAGE, "", ""),  # http.client: what came before the close is the answer
    "chunked-cut": (BROKEN, 200, b"", "answer broken off: chunked body cut off", ""),
    "chunked-bad-size": (BROKEN, 200, b"", "answer broken off: Invalid character in chunk size", ""),
    "not-http": (UNREACHABLE, None, b"", "connection failed: Expected HTTP/, RTSP/ or ICE/", ""),
    "bad-status": (UNREACHABLE, None, b"", "connection failed: Invalid status code", ""),
    "101-headers": (UNREACHABLE, None, b"", "connection failed: answer head over 100 header lines", ""),
    "99-headers": (OK, 200, b"", "", ""),
    "too-large": (TOO_LARGE, 200, b"", f"answer exceeds {MAX_BYTES} bytes", ""),
    "too-large-chunked": (TOO_LARGE, 200, b"", f"answer exceeds {MAX_BYTES} bytes", ""),
    "upper-case-chunked": (OK, 200, b"hello", "", ""),
    "spaces-after-size": (OK, 200, b"hello", "", "text/plain"),
    "headers-only-then-close": (OK, 200, b"", "", ""),
    "nothing": (BROKEN, None, b"", CLOSED, ""),
    # changed: http.client read these as OK 200 (the bad line ignored, the first length, "hello", an
    # empty page); llhttp will not frame an answer whose framing is in doubt, so they are no reading
    "header-without-colon": (UNREACHABLE, None, b"", "connection failed: Invalid header token", ""),
    "negative-length": (UNREACHABLE, None, b"", "connection failed: Invalid character in Content-Length", ""),
    "two-lengths": (UNREACHABLE, None, b"", "connection failed: Duplicate Content-Length", ""),
    "head-cut-by-close": (BROKEN, None, b"", CLOSED, ""),
}


def test_every_raw_answer_has_an_expected_reading():
    assert set(READ_AS) == set(ANSWERS)


@pytest.mark.parametrize("drip", [False, True], ids=["whole", "dripped"])
@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_each_raw_answer_is_read_as_http_client_reads_it(name, drip, run):  # noqa: F811
    server = RawServer(ANSWERS[name], drip=drip)
    try:
        fetched = run(Client(max_idle=0).request("GET", server.url + "/metrics", deadline=Deadline.after(5),
                                                 max_bytes=MAX_BYTES))
    finally:
        server.stop()
    assert (fetched.status, fetched.http_status, fetched.body, fetched.error, fetched.content_type) == READ_AS[name]


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


def observed(run, url: str):  # noqa: F811
    client = Client()
    try:
        return run(observe_backend(client, url, Deadline.after(DEADLINE), Options(engine="vllm")))
    finally:
        client.close()


# (status, the verdict of that one observation)
EXPECTED = {
    "refused": (REFUSED, "down"),
    "silent": (TIMEOUT, "down"),          # once; twice in a row is hung (test_verdict, the truth table)
    "closed": (UNREACHABLE, "down"),
    "reset_mid_answer": (BLIND, "blind"),
    "too_large": (BLIND, "blind"),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_each_ending_becomes_its_observation(kind, ending, too_large, run):  # noqa: F811
    if kind == "refused":
        url = f"http://127.0.0.1:{closed_port()}"
    else:
        url = too_large if kind == "too_large" else ending(kind)
    observation = observed(run, url)
    assert (observation.status, judge([observation]).state) == EXPECTED[kind], observation
    assert observation.reading is None and observation.probe is None


def test_each_ending_has_its_message(ending, run):  # noqa: F811
    client = Client(max_idle=0)

    def get(url: str, seconds: float = DEADLINE):
        return run(client.request("GET", url + "/metrics", deadline=Deadline.after(seconds)))
    assert get(f"http://127.0.0.1:{closed_port()}").error == "connection refused"
    silent = get(ending("silent"))
    assert (silent.status, re.sub(r"[0-9.]+s$", "Ns", silent.error)) == (TIMEOUT, "connection accepted, no answer within Ns")
    assert get(ending("closed")).error == CLOSED
    reset = get(ending("reset_mid_answer"))
    assert (reset.status, reset.http_status) == (BROKEN, 200) and reset.error.startswith("answer broken off: ")
    late = get(ending("silent"), -1)
    assert (late.status, late.error) == (TIMEOUT, "no time left in the 0s budget")


def test_a_tls_handshake_that_fails_is_unreachable(run):  # noqa: F811
    """https:// to a server that speaks plain HTTP: no HTTP answer at all, so down — never a reading."""
    server = PageServer()
    try:
        observation = observed(run, server.url.replace("http://", "https://"))
    finally:
        server.stop()
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation


def test_a_name_that_does_not_resolve_is_unreachable(run):  # noqa: F811
    observation = observed(run, "http://no-such-backend.invalid:8000")  # .invalid never resolves (RFC 6761)
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation


@pytest.mark.parametrize("url", ["http://[::1:8000/metrics", "http://127.0.0.1:99999/metrics", "ftp://x/metrics",
                                 "http:///metrics", "http://127.0.0.1:8000/a b"])
def test_a_bad_url_is_unreachable_never_an_exception(url, run):  # noqa: F811
    fetched = run(Client().request("GET", url, deadline=Deadline.after(1)))
    assert fetched.status == UNREACHABLE and fetched.error.startswith("connection failed: "), fetched


def test_a_request_and_an_observation_speak_one_set_of_status_names():
    """One definition (``hangwatch.observation``): a request's ending that is no answer becomes an
    observation of the same name (a connection closed without an answer is unreachable)."""
    from hangwatch import observation
    from hangwatch.answer import ENDINGS, Fetched
    from hangwatch.observe import not_answered

    assert {status for status, _ in ENDINGS.values()} == {OK, REFUSED, UNREACHABLE, TIMEOUT, HTTP_ERROR, TOO_LARGE,
                                                          BROKEN}
    assert not hasattr(observation, "ANSWERED")
    for status in (REFUSED, UNREACHABLE, TIMEOUT):
        assert not_answered(0.0, Fetched(status, error="x"), "/metrics").status == status
    assert not_answered(0.0, Fetched(BROKEN, error="x"), "/metrics").status == UNREACHABLE
    assert not_answered(0.0, Fetched(TOO_LARGE, error="x"), "/metrics").status == BLIND
    assert not_answered(0.0, Fetched(OK), "/metrics") is None


class CloseOnSecondRequest(SocketServer):
    """Answers the first request keep-alive; closes the connection when the second arrives on it
    (after reading it: a server that timed the idle connection out just as it was reused). A
    fresh connection is answered."""

    def __init__(self):
        self.connections, self.answered = 0, 0
        self.lock = threading.Lock()
        super().__init__(backlog=16)

    def _serve(self, conn):
        conn.settimeout(5)
        with self.lock:
            self.connections += 1
        with conn:
            try:
                for n in range(2):
                    if self.read_head(conn) is None:
                        return
                    if n == 1:
                        return  # read, never answered: closed mid-request
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                    with self.lock:
                        self.answered += 1
            except OSError:
                pass


def test_a_reused_connection_closed_mid_request_is_asked_again_fresh_once(run):  # noqa: F811
    server = CloseOnSecondRequest()
    client = Client()

    async def twice():
        first = await client.request("GET", server.url + "/metrics", deadline=Deadline.after(5))
        assert len(client.idle) == 1  # kept: the condition the second request depends on
        second = await client.request("GET", server.url + "/metrics", deadline=Deadline.after(5))
        return first, second
    try:
        first, second = run(twice())
    finally:
        client.close()
        server.stop()
    assert (first.status, first.body, second.status, second.body) == (OK, b"hello", OK, b"hello"), second
    assert server.connections == 2 and server.answered == 2
