#!/usr/bin/env python3
"""Many vLLM backends in one process, for the exporter's scale benchmark.

Each backend is its own listening port on 127.0.0.1, so every target the exporter reads is
a distinct ``host:port`` with its own connections, as thousands of real servers would be
(one port with many paths would let a client share one connection across "targets").
Every backend answers like a real vLLM 0.32 (the captures in ``tests/data/vllm-0.32``):
``/metrics`` is the captured busy page (4 running, so no idle probe is due), gzipped when
the client accepts gzip as vLLM's prometheus_client does (compressed once here), ``/version``,
``/v1/models`` and ``/v1/completions`` the captured answers. Like vLLM's uvicorn
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, default 5 s), an idle keep-alive connection is closed
after ``--keep-alive`` seconds.

The answers are encoded once; one asyncio loop serves every port, so the fleet costs little
CPU beside the exporter it feeds.

    python bench/fleet.py --count 1000 [--page tests/data/vllm-0.32/busy.prom]

prints one JSON line ``{"ports": [...], "pid": ...}`` when every port listens, then serves
until stdin closes or SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import resource
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm-0.32"
MAX_HEAD = 16384


def _response(status: str, content_type: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"\r\n").encode() + body


def answers(page: bytes) -> dict[tuple[bytes, bytes], bytes]:
    """(method, path) -> the full HTTP response, encoded once. ``/metrics+gzip`` is the page
    as vLLM's prometheus_client sends it to a client accepting gzip (compressed at level 9)."""
    json_type = "application/json"
    metrics_type = "text/plain; version=1.0.0; charset=utf-8"
    zipped = gzip.compress(page, compresslevel=9)
    return {
        (b"GET", b"/metrics"): _response("200 OK", metrics_type, page),
        (b"GET", b"/metrics+gzip"): (f"HTTP/1.1 200 OK\r\nContent-Type: {metrics_type}\r\nContent-Encoding: gzip\r\n"
                                     f"Content-Length: {len(zipped)}\r\n\r\n").encode() + zipped,
        (b"GET", b"/version"): _response("200 OK", json_type, (DATA / "version.json").read_bytes()),
        (b"GET", b"/v1/models"): _response("200 OK", json_type, (DATA / "models.json").read_bytes()),
        (b"POST", b"/v1/completions"): _response(
            "200 OK", json_type, (DATA / "completion-max-tokens-1.json").read_bytes()),
    }


NOT_FOUND = _response("404 Not Found", "application/json", b'{"detail":"Not Found"}')


class Backend(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to one backend port (bodies are read and ignored)."""

    def __init__(self, table, keep_alive: float, stats: dict):
        self.table, self.keep_alive, self.stats = table, keep_alive, stats
        self.buffer = b""
        self.idle = None

    def connection_made(self, transport):
        self.transport = transport
        self.stats["connections"] += 1
        self._arm()

    def _arm(self):
        if self.idle is not None:
            self.idle.cancel()
        self.idle = asyncio.get_running_loop().call_later(self.keep_alive, self.transport.close)

    def data_received(self, data):
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self.transport.close()
                return
            head = self.buffer[:end]
            length, gzipped = 0, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip() or 0)
                elif name == b"accept-encoding":
                    gzipped = b"gzip" in value.lower()
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            method, path = head.split(b" ", 2)[:2]
            if gzipped and path == b"/metrics":
                path = b"/metrics+gzip"
            self.stats["requests"] += 1
            self.transport.write(self.table.get((method, path), NOT_FOUND))
            self._arm()

    def connection_lost(self, exc):
        if self.idle is not None:
            self.idle.cancel()


async def serve(count: int, page: bytes, keep_alive: float) -> None:
    loop = asyncio.get_running_loop()
    table = answers(page)
    stats = {"connections": 0, "requests": 0}
    servers = [await loop.create_server(lambda: Backend(table, keep_alive, stats), "127.0.0.1", 0, backlog=1024)
               for _ in range(count)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps({"ports": ports, "pid": os.getpid()}), flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.buffer.read1(65536) or stop.set())
    await stop.wait()
    sys.stderr.write(f"fleet: {stats['connections']} connections, {stats['requests']} requests\n")


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--page", default=str(DATA / "busy.prom"))
    parser.add_argument("--keep-alive", type=float, default=5.0, help="idle keep-alive seconds (vLLM: 5)")
    args = parser.parse_args(argv)
    raise_fd_limit(args.count * 3 + 256)
    asyncio.run(serve(args.count, Path(args.page).read_bytes(), args.keep_alive))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
