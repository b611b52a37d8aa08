"""What an unauthenticated client can make the webhook hold: its RSS and its temporary files.

``Watch`` samples a process's resident memory and the bytes of the temporary files it has open
(waitress spools a large request body to ``tempfile.TemporaryFile``: unlinked at once, so only
``/proc/PID/fd`` still sees it) until stopped, keeping the peaks. ``flood`` opens many
connections at once, each sending a request head without a token and then as much of a large
body as the server reads, until the server closes it or all of it is sent.
"""
from __future__ import annotations

import os
import selectors
import socket
import threading
import time


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def temp_bytes(pid: int, directory: str) -> int:
    """Bytes in the files under ``directory`` the process holds open (deleted ones included)."""
    total = 0
    fds = f"/proc/{pid}/fd"
    for name in os.listdir(fds):
        try:
            if os.readlink(os.path.join(fds, name)).startswith(directory):
                total += os.stat(os.path.join(fds, name)).st_size
        except OSError:  # closed meanwhile
            pass
    return total


class Watch:
    """Peak RSS and peak temporary-file bytes of ``pid`` while it runs (sampled every 10 ms)."""

    def __init__(self, pid: int, temp_dir: str):
        self.pid, self.temp_dir = pid, temp_dir
        self.baseline = rss_bytes(pid)
        self.peak_rss = self.baseline
        self.peak_temp = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch-rss", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.01)

    def sample(self):
        self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
        self.peak_temp = max(self.peak_temp, temp_bytes(self.pid, self.temp_dir))

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.sample()

    @property
    def grew(self) -> int:
        return self.peak_rss - self.baseline


def flood(port: int, connections: int, body_bytes: int, deadline: float, *, head: bytes | None = None) -> dict:
    """``connections`` clients at once, each ``POST /alerts`` without a token and a body of
    ``body_bytes`` sent as fast as the server takes it. Returns how many were answered, closed
    by the server and sent their whole body; every socket is closed on return."""
    head = head or (b"POST /alerts HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % body_bytes)
    chunk = b"x" * 65536
    selector = selectors.DefaultSelector()
    sent = {}
    answered = closed = whole = 0
    end = time.monotonic() + deadline
    try:
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            sock.setblocking(False)
            sent[sock] = -len(head)
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        pending = dict.fromkeys(sent)
        data = {sock: bytearray(head) for sock in sent}
        while pending and time.monotonic() < end:
            for key, events in selector.select(timeout=0.2):
                sock = key.fileobj
                if events & selectors.EVENT_READ:
                    try:
                        answer = sock.recv(65536)
                    except OSError:
                        answer = b""
                    if answer:  # answered before the whole body was taken, or after it: done either way
                        answered += answer.startswith(b"HTTP/")
                    else:
                        closed += 1
                    selector.unregister(sock)
                    pending.pop(sock, None)
                    continue
                if events & selectors.EVENT_WRITE:
                    if not data[sock]:
                        left = body_bytes - max(sent[sock], 0)
                        if left <= 0:
                            whole += 1
                            selector.modify(sock, selectors.EVENT_READ)
                            continue
                        data[sock] = bytearray(chunk[:left])
                    try:
                        written = sock.send(data[sock])
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        closed += 1
                        selector.unregister(sock)
                        pending.pop(sock, None)
                        continue
                    del data[sock][:written]
                    sent[sock] += written
    finally:
        for sock in sent:
            sock.close()
        selector.close()
    return {"answered": answered, "closed": closed, "whole_body_sent": whole}
