#!/usr/bin/env python3
"""CPU per request of the HTTP client: keep-alive and fresh connections, on stock asyncio and on
uvloop (the thread client it replaced, ``fetch.Client``, measured in bench/RESULTS-client.md).

    flock /work/heavy.lock python bench/bench_client.py [--requests 2000] [--rounds 3]

The backend is a separate process (a small asyncio server answering a captured vLLM idle page
with a Content-Length), so only the client's CPU is counted: this process's user+system time
over N sequential GETs of ``/metrics`` (one request in flight, as one reading of one backend).
Prints a markdown table: per client and connection kind, µs of CPU per request, min–max over rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hangwatch.client import Client  # noqa: E402
from hangwatch.deadline import Deadline  # noqa: E402

PAGE = ROOT / "tests" / "data" / "vllm-0.32" / "idle.prom"
SERVER = """
import asyncio, sys
page = open(sys.argv[1], "rb").read()
answer = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain; version=0.0.4\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(page) + page
class Serve(asyncio.Protocol):
    def connection_made(self, transport): self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while b"\\r\\n\\r\\n" in self.buffer:
            _, _, self.buffer = self.buffer.partition(b"\\r\\n\\r\\n")
            self.transport.write(answer)
async def main():
    server = await asyncio.get_running_loop().create_server(Serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def cpu() -> float:
    return time.process_time()


async def loop_client(url: str, n: int, keep: bool) -> float:
    client = Client(max_idle=64 if keep else 0)
    await client.request("GET", url, deadline=Deadline.after(5))
    started = cpu()
    for _ in range(n):
        assert (await client.request("GET", url, deadline=Deadline.after(5))).status == "ok"
    used = cpu() - started
    client.close()
    return used


def measure(kind: str, url: str, n: int, keep: bool) -> float:
    """µs of CPU per request."""
    if kind == "asyncio":
        used = asyncio.run(loop_client(url, n, keep))
    else:
        import uvloop
        loop = uvloop.new_event_loop()
        try:
            used = loop.run_until_complete(loop_client(url, n, keep))
        finally:
            loop.close()
    return used / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(PAGE)], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/metrics"
        kinds = ["asyncio", "uvloop"]
        results = {(kind, keep): [] for kind in kinds for keep in (True, False)}
        for _ in range(args.rounds):  # rounds interleaved: a noisy minute hits every client alike
            for kind, keep in results:
                results[kind, keep].append(measure(kind, url, args.requests, keep))
    finally:
        server.kill()
        server.wait()
    print(f"| client | keep-alive µs CPU/request | fresh connection µs CPU/request |  ({args.requests} GETs "
          f"of a {PAGE.stat().st_size:,} B page, {args.rounds} rounds, min–max)")
    print("|---|---|---|")
    for kind in kinds:
        cells = [f"{min(v):.0f}–{max(v):.0f}" for v in (results[kind, True], results[kind, False])]
        print(f"| {kind} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
