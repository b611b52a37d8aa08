"""A recording HTTP proxy between hangwatch and vLLM: the soak's independent witness.

How it measures: bench/README.md.
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from harness.vllm_server import parse_prometheus

READS = ("/metrics", "/version", "/health")
MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Sent:
    """One request hangwatch sent to vLLM."""
    at: float                    # time.monotonic() when it had fully arrived here
    wall: float                  # time.time() then
    method: str
    path: str
    clients_in_flight: int       # the load's and the watchdog's open requests then
    server_in_flight: float | None  # vLLM's running + waiting right before forwarding (None: a read, or unknown)
    server_read_error: str = ""

    @property
    def read_only(self) -> bool:
        return self.path.split("?", 1)[0] in READS

    @property
    def while_busy(self) -> bool:
        """Sent while anything was in flight, by either witness (reads are not requests)."""
        return not self.read_only and (self.clients_in_flight > 0 or (self.server_in_flight or 0) > 0)


class RecordingProxy:
    def __init__(self, upstream_url: str, in_flight, gauge_timeout_s: float = 5.0):
        parts = urlsplit(upstream_url)
        self.upstream_url = upstream_url.rstrip("/")
        self.upstream = (parts.hostname, parts.port or 80)
        self.in_flight = in_flight
        self.gauge_timeout_s = gauge_timeout_s
        self._sent: list[Sent] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="soak-proxy")

    def start(self) -> "RecordingProxy":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    def sent(self) -> list[Sent]:
        with self._lock:
            return list(self._sent)

    # -- the witnesses -----------------------------------------------------------------------
    def server_in_flight(self) -> tuple[float | None, str]:
        try:
            page = parse_prometheus(requests.get(self.upstream_url + "/metrics",
                                                 timeout=self.gauge_timeout_s).text)
        except (requests.RequestException, ValueError, AssertionError) as exc:
            return None, f"{type(exc).__name__}: {exc}"[:200]
        running = page.value("vllm:num_requests_running")
        waiting = page.value("vllm:num_requests_waiting")
        if running is None and waiting is None:
            return None, "no vllm:num_requests_running/waiting on the page"
        return (running or 0) + (waiting or 0), ""

    def _record(self, method: str, path: str) -> None:
        at, wall = time.monotonic(), time.time()
        clients = self.in_flight.total()
        server, error = None, ""
        if path.split("?", 1)[0] not in READS:
            server, error = self.server_in_flight()
        with self._lock:
            self._sent.append(Sent(at, wall, method, path, clients, server, error))

    # -- plumbing ----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True, name="soak-proxy-conn").start()

    def _connection(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True, name="soak-proxy-back")
        back.start()
        buffer = b""
        try:
            while True:
                head, buffer = _read_until(client, buffer, b"\r\n\r\n", MAX_HEAD)
                if head is None:
                    break
                method, path, headers = _parse_head(head)
                body, buffer = _read_body(client, buffer, headers)
                self._record(method, path)
                upstream.sendall(head + body)
        except (OSError, ValueError):
            pass
        finally:
            for sock in (upstream, client):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            back.join(5)
            upstream.close()
            client.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _read_until(sock, buffer: bytes, marker: bytes, limit: int) -> tuple[bytes | None, bytes]:
    """(everything up to and including ``marker``, the rest); (None, b"") at a clean EOF."""
    while marker not in buffer:
        if len(buffer) > limit:
            raise ValueError("request head too long")
        data = sock.recv(65536)
        if not data:
            if buffer.strip():
                raise ValueError("connection closed inside a request head")
            return None, b""
        buffer += data
    end = buffer.index(marker) + len(marker)
    return buffer[:end], buffer[end:]


def _read_exact(sock, buffer: bytes, n: int) -> tuple[bytes, bytes]:
    while len(buffer) < n:
        data = sock.recv(65536)
        if not data:
            raise ValueError("connection closed inside a request body")
        buffer += data
    return buffer[:n], buffer[n:]


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _read_body(sock, buffer: bytes, headers: dict[str, str]) -> tuple[bytes, bytes]:
    """The request's body, raw (framing included), and what follows it."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            line, buffer = _read_until(sock, buffer, b"\r\n", MAX_HEAD)
            if line is None:
                raise ValueError("connection closed inside a chunked body")
            body += line
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                trailer, buffer = _read_until(sock, b"\r\n" + buffer, b"\r\n\r\n", MAX_HEAD)
                return body + trailer[2:], buffer
            chunk, buffer = _read_exact(sock, buffer, size + 2)
            body += chunk
    return _read_exact(sock, buffer, int(headers.get("content-length", "0") or 0))
