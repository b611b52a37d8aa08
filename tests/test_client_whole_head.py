"""An answer's head read in one piece (``Answer._whole_head``) reads exactly as line by line.

The one-piece read is only a shortcut for the usual head; whatever it takes must come out as
the line-by-line reading (every limit and message of it measured against http.client's in
test_client_outcomes.py) would have it: the same status, type, framing, body and errors.
"""
from __future__ import annotations

import random

import pytest

from hangwatch.answer import MAX_LINE, Answer, BadAnswer

STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 503 x", b"HTTP/1.1 301 M",
                b"HTTP/1.1 100 Continue", b"HTTP/1.1 101 Switching", b"HTTP/1.1 2000 OK", b"HTTP/1.1 20 OK",
                b"HTTP/1.7 200 OK", b"HTTP/2.0 200 OK", b"HTTP/1.1 200", b"HTTP/1.1  200 OK", b"junk", b"",
                b"HTTP/1.1 200 content-type: sneaky", b"HTTP/1.1 204 No Content", b"HTTP/1.1 304 Not Modified"]
HEADERS = [b"Content-Type: text/plain; version=0.0.4", b"content-type: application/json", b"Content-Type:x",
           b"Content-Type : x", b" Content-Type: folded", b"Transfer-Encoding: chunked", b"transfer-encoding: gzip",
           b"Transfer-Encoding: gzip, chunked", b"Content-Length: 5", b"Content-Length: 0", b"Content-Length: x",
           b"Content-Length: 5", b"Connection: close", b"Connection: keep-alive", b"Server: uvicorn", b"X-Bin: \x01\xff",
           b"no colon", b"X-Long: " + b"a" * 300, b"Upgrade: websocket", b"Date: Sun, 06 Dec 2026 02:55:17 GMT"]
ENDS = [b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r\r\n"]
BODIES = [b"", b"hello", b"hello world, longer than five", b"5\r\nhello\r\n0\r\n\r\n", b"3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n",
          b"zz\r\n"]


def _read(pieces: list[bytes], whole_head: bool, head_only: bool = False):
    answer = Answer(64, head_only=head_only)
    if not whole_head:
        answer._whole_head = lambda data: 0
    try:
        for piece in pieces:
            answer.feed(piece)
            if answer.complete or answer.over:
                break
        else:
            answer.eof()
        error = None
    except BadAnswer as exc:
        error = str(exc)
    return (error, answer.status, answer.content_type, answer.chunked, answer.body(), answer.complete,
            answer.keep_alive, answer.over)


def _answers(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        usual = rng.random() < 0.5  # an answer as servers write them: CRLF lines, all in one read
        lines = [rng.choice(STATUS_LINES[:5] if usual else STATUS_LINES)] + rng.sample(HEADERS, rng.randint(0, 6))
        if rng.random() < 0.05:
            lines += [b"X-Many: 1"] * 100
        if rng.random() < 0.03:
            lines.append(b"X-Huge: " + b"h" * MAX_LINE)
        ends = ENDS[:1] if usual else ENDS
        head = b"".join(line + rng.choice(ends) for line in lines) + rng.choice(ends + [b"\n"])
        if lines[0].startswith(b"HTTP/1.1 100") and rng.random() < 0.7:
            head += b"HTTP/1.1 200 OK\r\nContent-Type: after\r\nContent-Length: 2\r\n\r\n"
        data = head + rng.choice(BODIES)
        cuts = [] if usual else sorted(rng.sample(range(1, len(data)), min(rng.randint(0, 3), len(data) - 1)))
        yield [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])], rng.random() < 0.1


@pytest.mark.parametrize("seed", range(4))
def test_a_head_read_whole_reads_as_line_by_line(seed):
    taken = 0
    for pieces, head_only in _answers(seed, 500):
        assert _read(pieces, True, head_only) == _read(pieces, False, head_only), pieces
        answer = Answer(64, head_only=head_only)
        taken += answer._whole_head(pieces[0]) > 0
    assert taken > 50  # the shortcut is taken often enough to be tested


def test_the_usual_head_is_read_in_one_piece():
    answer = Answer(1 << 20)
    parsed = []
    answer._parse = parsed.append  # (what goes to the parser line by line)
    answer.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n")
    assert (answer.status, answer.content_type, parsed) == (200, "text/plain", [])
