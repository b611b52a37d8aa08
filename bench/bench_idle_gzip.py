"""Benchmark: does asking for a gzipped /metrics page cost the reader more CPU than it saves?

vLLM's prometheus_client gzips the ~52 KB page (to ~5 KB) when asked. The reader then moves a
tenth of the bytes through the kernel and its HTTP parser, but inflates the page. Measured
with the cheapest reader we could build (an asyncio protocol over ``httptools``, keep-alive, as
the async client is), so the answer does not hinge on the thread client's per-byte cost: CPU
per GET /metrics in this process, the page inflated when it came gzipped, over many backends
served by ``bench/idle_backends.py`` from another process.

Run: ``flock /work/heavy.lock nice -n 19 python bench/bench_idle_gzip.py [--uvloop]``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httptools

ROOT = Path(__file__).resolve().parent.parent


class Reader(asyncio.Protocol):
    """One keep-alive connection: GET /metrics, the whole body, inflated if it came gzipped."""

    def __init__(self, accept: bytes):
        self.request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: hangwatch\r\nAccept-Encoding: " + accept + b"\r\n\r\n"
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future | None = None

    def connection_made(self, transport):
        self.transport = transport

    def get(self) -> asyncio.Future:
        self.chunks, self.gzipped = [], False
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        return self.done

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_header(self, name, value):
        if name.lower() == b"content-encoding" and value.lower() == b"gzip":
            self.gzipped = True

    def on_body(self, body):
        self.chunks.append(body)

    def on_message_complete(self):
        body = b"".join(self.chunks)
        self.done.set_result(zlib.decompress(body, 31) if self.gzipped else body)


async def measure(ports: list[int], accept: bytes, rounds: int) -> dict:
    loop = asyncio.get_running_loop()
    readers = []
    for port in ports:
        _, reader = await loop.create_connection(lambda: Reader(accept), "127.0.0.1", port)
        readers.append(reader)
    pages = await asyncio.gather(*(reader.get() for reader in readers))  # warm up
    assert all(len(page) == len(pages[0]) > 50_000 for page in pages)
    cpu = time.process_time()
    for _ in range(rounds):
        await asyncio.gather(*(reader.get() for reader in readers))
    cpu = time.process_time() - cpu
    for reader in readers:
        reader.transport.close()
    return {"accept": accept.decode(), "cpu_us_per_get": round(cpu * 1e6 / (rounds * len(ports)), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop
        uvloop.install()
    server = subprocess.Popen([sys.executable, str(ROOT / "bench" / "idle_backends.py"), str(args.backends)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(server.stdout.readline())["ports"]
        runs: dict[str, list[float]] = {"identity": [], "gzip": []}
        for _ in range(args.repeat):  # alternated, so a busy moment on a shared machine hits both
            for accept in (b"identity", b"gzip"):
                runs[accept.decode()].append(asyncio.run(measure(ports, accept, args.rounds))["cpu_us_per_get"])
        for accept, values in runs.items():
            print(json.dumps({"loop": "uvloop" if args.uvloop else "asyncio", "accept": accept,
                              "min_us": min(values), "median_us": statistics.median(values), "runs": values}))
    finally:
        server.stdin.close()
        server.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
