"""A backend that misbehaves on purpose, byte by byte: for the one-deadline-per-reading tests.

Real sockets, raw HTTP: the server reads the request line and headers, then answers as its
``mode`` says. ``drip_headers`` sends a status line and then one header line every
``gap`` seconds, forever; ``drip_body`` sends complete headers announcing a big body and
then one byte every ``gap`` seconds; ``slow_page`` sends a real page, ``chunk`` bytes every
``gap`` seconds; ``keepalive_then_close`` answers as keep-alive, then closes the connection
after ``gap`` (an idle keep-alive connection the server dropped). Paths not in ``modes`` (or in mode ``ok``) get a fast 200 with
``bodies[path]`` or ``body``.
"""
from __future__ import annotations

import socket
import threading
import time


class SocketServer:
    """A listening socket on a free loopback port and one thread per connection; a subclass says
    in ``_serve`` what a connection gets (``read_head`` reads its request line and headers)."""

    def __init__(self, backlog: int = 64):
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(backlog)
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    @staticmethod
    def read_head(conn: socket.socket) -> bytes | None:
        """The request's line and headers (None: the peer closed first)."""
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return None
            head += data
        return head


class HostileServer(SocketServer):
    def __init__(self, modes: dict[str, str], *, body: bytes = b"", bodies: dict[str, bytes] | None = None,
                 gap: float = 0.2, chunk: int = 64, content_type: str = "text/plain; version=0.0.4"):
        self.modes, self.body, self.gap, self.chunk, self.content_type = modes, body, gap, chunk, content_type
        self.bodies = bodies or {}
        self.requests: list[tuple[str, str]] = []
        self.closed = 0  # connections this server has closed (a test waits on it, never sleeps)
        super().__init__()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            self.closed += 1

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with conn:
                head = self.read_head(conn)
                if head is None:
                    return
                method, path = head.split(b"\r\n", 1)[0].decode().split(" ")[:2]
                self.requests.append((method, path))
                mode = self.modes.get(path, "ok")
                if mode == "drip_headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    n = 0
                    while not self._stop.is_set():
                        conn.sendall(b"X-Drip-%d: x\r\n" % n)
                        n += 1
                        time.sleep(self.gap)
                elif mode == "drip_body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: 1000000\r\n\r\n"
                                 % self.content_type.encode())
                    while not self._stop.is_set():
                        conn.sendall(b"#")
                        time.sleep(self.gap)
                elif mode == "slow_page":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                                 % (self.content_type.encode(), len(self.body)))
                    for start in range(0, len(self.body), self.chunk):
                        if self._stop.is_set():
                            return
                        conn.sendall(self.body[start:start + self.chunk])
                        time.sleep(self.gap)
                elif mode == "keepalive_then_close":  # as a server whose keep-alive timeout passed
                    body = self.bodies.get(path, self.body)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                                 % (self.content_type.encode(), len(body), body))
                    time.sleep(self.gap)
                elif mode.isdigit():
                    answer = b'{"error": "status %s"}' % mode.encode()
                    conn.sendall(b"HTTP/1.1 %s X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n%s" % (mode.encode(), len(answer), answer))
                else:
                    body = self.bodies.get(path, self.body)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                                 b"Connection: close\r\n\r\n%s" % (self.content_type.encode(), len(body), body))
        except OSError:
            pass
