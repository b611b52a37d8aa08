"""Many idle vLLM backends in one process, for ``bench_idle_path.py``: every port serves the
captured vLLM 0.32 idle page (gzipped when the client asks, as vLLM's prometheus_client does),
its /v1/models, /version and a 1-token completion, with keep-alive.

It runs apart from the measured process so that its CPU is not counted as hangwatch's. Run as
``python bench/idle_backends.py COUNT``: it prints one JSON line with the ports, serves until
its stdin closes, then prints one JSON line with the requests it answered per path.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import pathlib
import sys
from collections import Counter

import httptools

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-0.32"
PAGE = (DATA / "idle.prom").read_bytes()
PAGE_GZIP = gzip.compress(PAGE, 6)
ANSWERS = {
    ("GET", "/v1/models"): (DATA / "models.json").read_bytes(),
    ("GET", "/version"): (DATA / "version.json").read_bytes(),
    ("POST", "/v1/completions"): (DATA / "completion-max-tokens-1.json").read_bytes(),
}
SERVED: Counter = Counter()


def response(status: str, body: bytes, content_type: str, encoding: bytes | None = None) -> bytes:
    head = [b"HTTP/1.1 " + status.encode(), b"content-type: " + content_type.encode(),
            b"content-length: " + str(len(body)).encode()]
    if encoding:
        head.append(b"content-encoding: " + encoding)
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Backend(asyncio.Protocol):
    """One keep-alive connection: each complete request is answered at once, in order."""

    def connection_made(self, transport):
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.gzip = b"", False

    def data_received(self, data):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        if name.lower() == b"accept-encoding" and b"gzip" in value.lower():
            self.gzip = True

    def on_message_complete(self):
        method, path = self.parser.get_method().decode(), self.url.decode()
        SERVED[f"{method} {path}"] += 1
        if (method, path) == ("GET", "/metrics"):
            body, encoding = (PAGE_GZIP, b"gzip") if self.gzip else (PAGE, None)
            self.transport.write(response("200 OK", body, "text/plain; version=0.0.4", encoding))
        elif (method, path) in ANSWERS:
            self.transport.write(response("200 OK", ANSWERS[method, path], "application/json"))
        else:
            self.transport.write(response("404 Not Found", b'{"detail":"Not Found"}', "application/json"))
        self.url, self.gzip = b"", False


async def serve(count: int) -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Backend, "127.0.0.1", 0, backlog=1024) for _ in range(count)]
    print(json.dumps({"ports": [server.sockets[0].getsockname()[1] for server in servers]}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the measuring process closes our stdin
    print(json.dumps({"served": dict(SERVED)}), flush=True)


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(int(sys.argv[1])))
