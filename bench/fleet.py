#!/usr/bin/env python3
"""Many vLLM backends in one process, for the exporter's scale benchmark.

    python bench/fleet.py --count 1000 [--kind busy|idle] [--page FILE] [--static] [--loop uvloop|asyncio]

The first line out is JSON: the backends' ports, the pid, and ``stats_port``, where
``GET /_fleet/stats`` answers the requests served so far by method and path (what a subject
asked of the fleet: the idle probe's requests are counted here, not guessed).

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import email.utils
import gzip
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm-0.32"
MAX_HEAD = 16384
METRICS_TYPE = "text/plain; version=1.0.0; charset=utf-8"
JSON_TYPE = "application/json"
# A moving sample's growth per answer: counts, buckets and totals by one, sums by a fraction.
SUM_STEP = 0.37
MOVING_SUFFIXES = (b"_total", b"_count", b"_bucket", b"_sum")


def _head(status: str, content_type: str, length: int, extra: str = "") -> bytes:
    """uvicorn's head: lower-case names, date and server first."""
    return (f"HTTP/1.1 {status}\r\ndate: {_http_date()}\r\nserver: uvicorn\r\ncontent-length: {length}\r\n"
            f"content-type: {content_type}\r\n{extra}\r\n").encode()


_date = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if _date[0] != now:  # uvicorn also renders its date header once a second
        _date[0], _date[1] = now, email.utils.formatdate(now, usegmt=True)
    return _date[1]


def _response(status: str, content_type: str, body: bytes) -> tuple[bytes, bytes]:
    return _head(status, content_type, len(body)), body


class MovingPage:
    """The captured page as a template: its fixed text between the numbers that move. ``render(k)``
    is the page after ``k`` answers (every counter, bucket and count + k, every sum + 0.37 k:
    buckets stay cumulative, counts equal their +Inf bucket)."""

    def __init__(self, page: bytes):
        self.chunks: list[bytes] = []     # fixed text; a number goes between two chunks
        self.slots: list[tuple[float, float]] = []   # (value in the capture, growth per answer)
        pending = []
        for line in page.splitlines(keepends=True):
            if line.startswith(b"#") or not line.strip():
                pending.append(line)
                continue
            series, _, value = line.rstrip(b"\n").rpartition(b" ")
            name = series.split(b"{", 1)[0]
            if not name.endswith(MOVING_SUFFIXES):
                pending.append(line)
                continue
            pending.append(series + b" ")
            self.chunks.append(b"".join(pending))
            pending = [b"\n"]
            self.slots.append((float(value), SUM_STEP if name.endswith(b"_sum") else 1.0))
        self.chunks.append(b"".join(pending))

    def render(self, k: int) -> bytes:
        parts = []
        append = parts.append
        for chunk, (base, step) in zip(self.chunks, self.slots):
            append(chunk)
            append(repr(base + step * k).encode())
        append(self.chunks[-1])
        return b"".join(parts)


def answers(page: bytes) -> dict[tuple[bytes, bytes], tuple[bytes, bytes]]:
    """(method, path) -> (head, body) of the answers that never change, encoded once.
    ``/metrics+gzip`` is the page as vLLM's prometheus_client sends it to a client accepting
    gzip (compressed at level 9); the moving page is not here (``Backend.metrics``)."""
    zipped = gzip.compress(page, compresslevel=9)
    return {
        (b"GET", b"/metrics"): _response("200 OK", METRICS_TYPE, page),
        (b"GET", b"/metrics+gzip"): (_head("200 OK", METRICS_TYPE, len(zipped), "content-encoding: gzip\r\n"),
                                     zipped),
        (b"GET", b"/version"): _response("200 OK", JSON_TYPE, (DATA / "version.json").read_bytes()),
        (b"GET", b"/v1/models"): _response("200 OK", JSON_TYPE, (DATA / "models.json").read_bytes()),
        (b"POST", b"/v1/completions"): _response(
            "200 OK", JSON_TYPE, (DATA / "completion-max-tokens-1.json").read_bytes()),
    }


NOT_FOUND = _response("404 Not Found", "application/json", b'{"detail":"Not Found"}')


STATS_PATH = b"/_fleet/stats"


def new_stats() -> dict:
    """What the fleet counts: connections, requests, gzipped pages, and requests by "METHOD path"."""
    return {"connections": 0, "requests": 0, "gzipped": 0, "paths": {}}


class Backend(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to one backend port (bodies are read and ignored).

    ``split``: head and body in two writes, as uvicorn sends them (the busy and the idle fleet);
    False is the old static fleet's one write. ``control``: this port answers ``/_fleet/stats``
    and nothing else (it is not a backend, and its requests are not counted)."""

    def __init__(self, table, keep_alive: float, stats: dict, moving: MovingPage | None, answered: list[int],
                 split: bool | None = None, control: bool = False):
        self.table, self.keep_alive, self.stats = table, keep_alive, stats
        self.moving, self.answered = moving, answered  # answered: [metrics pages this backend served]
        self.split = moving is not None if split is None else split
        self.control = control
        self.buffer = b""
        self.idle = None

    def connection_made(self, transport):
        self.transport = transport
        if not self.control:
            self.stats["connections"] += 1
        self._arm()

    def _arm(self):
        if self.idle is not None:
            self.idle.cancel()
        self.idle = asyncio.get_running_loop().call_later(self.keep_alive, self.transport.close)

    def metrics(self, gzipped: bool) -> tuple[bytes, bytes]:
        self.answered[0] += 1
        body = self.moving.render(self.answered[0])
        if gzipped:
            body = gzip.compress(body, compresslevel=9)
            return _head("200 OK", METRICS_TYPE, len(body), "content-encoding: gzip\r\n"), body
        return _head("200 OK", METRICS_TYPE, len(body)), body

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
            if self.control:
                body = json.dumps(self.stats).encode() if path == STATS_PATH else NOT_FOUND[1]
                self.transport.write(_head("200 OK" if path == STATS_PATH else "404 Not Found", JSON_TYPE,
                                           len(body)) + body)
                continue
            self.stats["requests"] += 1
            key = f"{method.decode('latin-1')} {path.decode('latin-1')}"
            paths = self.stats.setdefault("paths", {})
            paths[key] = paths.get(key, 0) + 1
            if gzipped and path == b"/metrics":
                self.stats["gzipped"] += 1
            if self.moving is not None and method == b"GET" and path == b"/metrics":
                head_bytes, body = self.metrics(gzipped)
            else:
                if gzipped and path == b"/metrics":
                    path = b"/metrics+gzip"
                head_bytes, body = self.table.get((method, path), NOT_FOUND)
            if not self.split:
                self.transport.write(head_bytes + body)  # the old fleet: one write
            else:
                self.transport.write(head_bytes)  # uvicorn: http.response.start ...
                self.transport.write(body)        # ... then http.response.body
            self._arm()

    def connection_lost(self, exc):
        if self.idle is not None:
            self.idle.cancel()


async def serve(count: int, page: bytes, keep_alive: float, static: bool, moves: bool = True) -> None:
    """``static``: the old one-write fleet; ``moves``: the page's counters grow with every answer
    (a busy server); else the page is the capture, always (an idle server: nothing moves)."""
    loop = asyncio.get_running_loop()
    table = answers(page)
    moving = MovingPage(page) if moves and not static else None
    stats = new_stats()

    def backend_factory(index: int):
        # Per port: every connection to one backend sees the same counters move. Each port starts
        # at its own count, so no two busy backends serve the same page (real ones never do; the
        # same page everywhere let a reading kept by its page's digest answer 999 of 1,000 busy
        # scrapes: bench/RESULTS-busy-spread.md).
        answered = [index * 1_000_003]
        return lambda: Backend(table, keep_alive, stats, moving, answered, split=not static)

    servers = [await loop.create_server(backend_factory(index), "127.0.0.1", 0, backlog=1024)
               for index in range(count)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    control = await loop.create_server(lambda: Backend({}, 60.0, stats, None, [0], control=True), "127.0.0.1", 0)
    print(json.dumps({"ports": ports, "pid": os.getpid(), "stats_port": control.sockets[0].getsockname()[1]}),
          flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.buffer.read1(65536) or stop.set())
    await stop.wait()
    sys.stderr.write(f"fleet: {stats['connections']} connections, {stats['requests']} requests "
                     f"({stats['gzipped']} asked for gzip)\n")


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


PAGES = {"busy": DATA / "busy.prom", "idle": DATA / "idle.prom"}


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed: the fleet must cost little beside the subject it serves."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--kind", choices=sorted(PAGES), default="busy",
                        help="busy: the busy capture, its counters moving; idle: the idle capture, still")
    parser.add_argument("--page", default=None, help="another page (default: the kind's capture)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the fleet's own loop (uvloop if installed, the cheaper)")
    parser.add_argument("--keep-alive", type=float, default=5.0, help="idle keep-alive seconds (vLLM: 5)")
    parser.add_argument("--static", action="store_true",
                        help="the old fleet: one write, a page that never changes (to compare)")
    args = parser.parse_args(argv)
    raise_fd_limit(args.count * 3 + 256)
    page = Path(args.page or PAGES[args.kind]).read_bytes()
    with asyncio.Runner(loop_factory=new_loop if args.loop == "uvloop" else None) as runner:
        runner.run(serve(args.count, page, args.keep_alive, args.static, moves=args.kind == "busy"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
