"""Raw answers a backend could send, each a test case for the client: well-formed, lenient
(what ``http.client`` reads and so must hangwatch) and hostile. A ``RawServer`` sends one to every
request, whole or dripped a few bytes at a time, then closes (or keeps the connection)."""
from __future__ import annotations

import socket
import time

from tests.support.hostile import SocketServer

PAGE = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"

ANSWERS: dict[str, bytes] = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE,
    "chunked": CHUNKED + b"%x\r\n" % len(PAGE) + PAGE + b"\r\n0\r\n\r\n",
    "chunked-extension-and-trailer": CHUNKED + b"5;x=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
    "read-to-close": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE,
    "http-1.1-no-length": b"HTTP/1.1 200 OK\r\n\r\n" + PAGE,
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Type: text/plain\nContent-Length: 5\n\nhello",
    "no-reason": b"HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello",
    "early-hints-then-200": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "continue-then-200": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "204-with-length": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "500-long-body": b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + b"e" * 5000,
    "404": b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "short-length": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + PAGE,
    "chunked-cut": CHUNKED + b"100\r\n" + PAGE,
    "chunked-bad-size": CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n",
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n",
    "bad-status": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "101-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"Content-Length: 0\r\n\r\n",
    "99-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 98 + b"Content-Length: 0\r\n\r\n",
    "too-large": b"HTTP/1.1 200 OK\r\nContent-Length: 9000\r\n\r\n" + b"x" * 9000,
    "too-large-chunked": CHUNKED + b"2328\r\n" + b"x" * 9000 + b"\r\n0\r\n\r\n",
    "upper-case-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "spaces-after-size": CHUNKED + b"5  \r\nhello\r\n0\r\n\r\n",
    "headers-only-then-close": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
    "nothing": b"",
    # llhttp refuses these where http.client read on (the answer's framing is in doubt)
    "header-without-colon": b"HTTP/1.1 200 OK\r\nbad header line\r\nContent-Length: 5\r\n\r\nhello",
    "negative-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "head-cut-by-close": b"HTTP/1.1 200 OK\r\nX-A: b",
}
MAX_BYTES = 8192  # what the tests ask for: "too-large" passes it


class RawServer(SocketServer):
    """Answers every request with ``answer``; ``drip``: a few bytes at a time; then closes."""

    def __init__(self, answer: bytes, drip: bool = False, keep: bool = False):
        self.answer, self.drip, self.keep = answer, drip, keep
        super().__init__(backlog=16)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            try:
                while self.read_head(conn) is not None:
                    if not self.drip:
                        conn.sendall(self.answer)
                    else:
                        for start in range(0, len(self.answer), 7):
                            conn.sendall(self.answer[start:start + 7])
                            time.sleep(0.0005)
                    if not self.keep:
                        return
            except OSError:
                pass
