"""An answer reads the same whatever pieces it arrives in.

``Answer`` feeds llhttp each piece as it comes and measures its bounds (the head's bytes and
header lines, a chunked body's framing) over what was fed, so how the network cut the bytes must
never change the reading: the same status, type, framing, body and errors, whole or cut anywhere.
"""
from __future__ import annotations

import random

import pytest

from hangwatch.answer import MAX_HEAD, Answer, BadAnswer

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


def _read(pieces: list[bytes], head_only: bool = False):
    answer = Answer(64, head_only=head_only)
    try:
        for piece in pieces:
            answer.feed(piece)
            if answer.complete or answer.over:
                break
        else:
            answer.eof()
    except BadAnswer as exc:
        return str(exc), answer.status  # (the rest of a refused answer is never used)
    return (None, answer.status, answer.content_type, answer.chunked, answer.body(), answer.complete,
            answer.keep_alive, answer.over)


def _answers(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        usual = rng.random() < 0.5  # an answer as servers write them: CRLF lines, all in one read
        lines = [rng.choice(STATUS_LINES[:5] if usual else STATUS_LINES)] + rng.sample(HEADERS, rng.randint(0, 6))
        if rng.random() < 0.05:
            lines += [b"X-Many: 1"] * 100
        if rng.random() < 0.03:
            lines.append(b"X-Huge: " + b"h" * MAX_HEAD)
        ends = ENDS[:1] if usual else ENDS
        head = b"".join(line + rng.choice(ends) for line in lines) + rng.choice(ends + [b"\n"])
        if lines[0].startswith(b"HTTP/1.1 100") and rng.random() < 0.7:
            head += b"HTTP/1.1 200 OK\r\nContent-Type: after\r\nContent-Length: 2\r\n\r\n"
        data = head + rng.choice(BODIES)
        cuts = [] if usual else sorted(rng.sample(range(1, len(data)), min(rng.randint(0, 3), len(data) - 1)))
        yield [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])], rng.random() < 0.1


@pytest.mark.parametrize("seed", range(4))
def test_an_answer_cut_anywhere_reads_as_whole(seed):
    cut = 0
    for pieces, head_only in _answers(seed, 500):
        whole = _read([b"".join(pieces)], head_only)
        assert _read(pieces, head_only) == whole, pieces
        dripped = b"".join(pieces)
        assert _read([dripped[i:i + 7] for i in range(0, len(dripped), 7)], head_only) == whole, pieces
        cut += len(pieces) > 1
    assert cut > 50  # answers cut by the generator itself, beside the 7-byte drip
