"""A Prometheus-shaped load on the exporter: many targets, each scraped on its own schedule.

How it measures: bench/README.md.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

MAX_IDLE = 1000  # Prometheus: MaxIdleConnsPerHost


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)   # seconds, successful scrapes
    failures: dict[str, int] = field(default_factory=dict)  # kind -> count
    started: int = 0

    def fail(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def quantile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Scraper:
    """One job's HTTP client: a keep-alive pool to the exporter, like Go's http.Transport."""

    def __init__(self, host: str, port: int, timeout: float, expect: bytes = b"\nhangwatch_up 1"):
        self.host, self.port, self.timeout, self.expect = host, port, timeout, expect
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.connections_opened = 0

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()

    async def _connection(self, fresh: bool):
        while self.idle and not fresh:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        self.connections_opened += 1
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        return reader, writer, False

    async def scrape(self, path: str, result: Result, fresh: bool = False) -> None:
        result.started += 1
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._scrape(path, result, fresh, started), self.timeout)
        except asyncio.TimeoutError:
            result.fail("timeout")

    async def _scrape(self, path: str, result: Result, fresh: bool, started: float) -> None:
        try:
            reader, writer, reused = await self._connection(fresh)
        except OSError as exc:
            result.fail(f"connect: {exc.strerror or exc}")
            return
        request = (f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUser-Agent: Prometheus/2.42.0\r\n"
                   f"Accept: text/plain;version=0.0.4;q=0.2,*/*;q=0.1\r\n"
                   f"X-Prometheus-Scrape-Timeout-Seconds: {self.timeout:g}\r\n\r\n").encode()
        keep = False
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            version, status = lines[0].split(" ")[:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await read_chunked(reader)  # Go's server chunks an answer over 2 KiB
            elif "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            else:
                body = await reader.read()
            keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            # Go retries a request on a reused connection the server closed meanwhile.
            writer.close()
            if reused and isinstance(exc, (asyncio.IncompleteReadError, ConnectionResetError)):
                result.started -= 1
                await self._scrape(path, result, True, started)
                return
            result.fail(f"connection: {type(exc).__name__}")
            return
        finally:
            if not keep:
                writer.close()
        if keep and len(self.idle) < MAX_IDLE:
            self.idle.append((reader, writer))
        elif keep:
            writer.close()
        if status != "200":
            result.fail(f"HTTP {status}")
        elif self.expect not in body:
            result.fail(f"answer without {self.expect.decode().strip()}")
        else:
            result.latencies.append(time.monotonic() - started)


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (RFC 9112 7.1), trailers skipped."""
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def spread(scraper: Scraper, paths: list[str], interval: float, rounds: int,
                 warmup_rounds: int = 1, on_window=None) -> Result:
    """Every path once per ``interval``, offsets spread evenly; only the last ``rounds`` count.

    ``on_window()`` is called when the measured rounds begin and again when they have ended.
    """
    loop = asyncio.get_running_loop()
    warm, measured = Result(), Result()
    begin = loop.time() + 0.2
    n = len(paths)
    if on_window is not None:
        loop.call_at(begin + warmup_rounds * interval, on_window)

    async def target(i: int, path: str):
        for k in range(warmup_rounds + rounds):
            at = begin + k * interval + i * interval / n
            await asyncio.sleep(max(0.0, at - loop.time()))
            await scraper.scrape(path, warm if k < warmup_rounds else measured)

    await asyncio.gather(*(target(i, p) for i, p in enumerate(paths)))
    if on_window is not None:
        on_window()
    return measured


async def burst(scraper: Scraper, paths: list[str]) -> Result:
    """Every path at once, each on a fresh connection."""
    scraper.close()
    result = Result()
    await asyncio.gather(*(scraper.scrape(p, result, fresh=True) for p in paths))
    return result
