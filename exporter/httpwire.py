"""What goes over the wire: a request head checked and parsed, a response encoded. Heads are
parsed by llhttp (``httptools``: the parser of Node.js and uvicorn), strict, plus the checks it
leaves to its caller (``parse_head``), so whatever a client sends becomes a ``Head`` or a
``BadRequest`` with the status to answer (400/431), never an exception past its connection.
"""
from __future__ import annotations

from dataclasses import dataclass
from http.client import responses  # reason phrases by status
from typing import Callable, Mapping, NamedTuple, Protocol

import httptools

MAX_HEAD_BYTES = 16384      # request line and headers; Prometheus sends ~300 bytes
MAX_HEADERS = 100


class Slot(Protocol):
    """The work slot a request holds (``Connection``): a wait is not work."""

    async def pause(self, seconds: float, within: float) -> bool:
        """Wait ``seconds`` without the slot, then hold one again before work not yet started;
        False when none came within ``within`` seconds."""

    def release(self) -> None:
        """Give the slot back for good: what is left is waiting for work done elsewhere (a
        shared check), then cheap."""


class Request(NamedTuple):
    """(A tuple: one is made per request, and a frozen dataclass's ``__init__`` costs 1.6% of a
    busy scrape's CPU, bench/RESULTS-busy-spread.md.)"""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]        # names in lower case
    received: float                   # time.monotonic() when the head was complete
    client: str = ""
    slot: Slot | None = None          # its connection's slot (held only while a work route runs)


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Route:
    """``inline``: ``handler(request) -> Response``, cheap and never blocking, answered on the
    loop at once. Otherwise it is work: ``handler`` is a coroutine function
    (``async handler(request) -> Response``) awaited on the loop; it holds a slot until it is
    answered, and must start within ``start_within(request)`` seconds of arriving or be answered
    ``overloaded(request)`` instead."""

    handler: Callable[[Request], object]
    inline: bool = False
    start_within: Callable[[Request], float] = lambda request: 5.0
    overloaded: Callable[[Request], Response] = lambda request: plain(503, "overloaded: no slot free in time\n")


def plain(status: int, text: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", text.encode())


class BadRequest(Exception):
    """A head that is answered ``status`` and closed."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


class Head(NamedTuple):
    """What a request head says, once llhttp has accepted it and the checks below have passed."""

    method: str
    path: str
    query: str
    headers: dict[str, str]   # names in lower case, values without surrounding blanks (the last wins)
    keep_alive: bool


class _HeadReader:
    """llhttp's callbacks for one head (a fresh parser per head: none of its state outlives it)."""

    __slots__ = ("url", "headers", "hosts", "count", "complete")

    def __init__(self):
        self.url, self.headers, self.hosts, self.count, self.complete = b"", {}, 0, 0, False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        if self.count > MAX_HEADERS:
            raise BadRequest(431, "too many headers")
        key = name.decode("latin-1").lower()
        if key == "host":
            self.hosts += 1
        self.headers[key] = value.decode("latin-1").strip(" \t")

    def on_message_complete(self) -> None:
        self.complete = True


def head_length(buffer: bytes) -> int:
    """The length of the request head that starts ``buffer`` (its blank line included), or 0
    while it is not whole yet. A head too large, or one with a line ended by LF alone (which a
    CRLF blank line would then never end), is refused at once instead of at read_timeout."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise BadRequest(431, "request head too large")
        if b"\n\n" in buffer or b"\n\r\n" in buffer:
            raise BadRequest(400, "bad request: lines must end with CRLF")
        return 0
    if end + 4 > MAX_HEAD_BYTES:
        raise BadRequest(431, "request head too large")
    return end + 4


def parse_head(head: bytes) -> Head:
    """A request head, up to and including its blank line, as llhttp (strict) reads it, plus what
    llhttp leaves to its caller: only HTTP/1.0 and 1.1, one SP between the request line's parts,
    exactly one Host on 1.1 (at most one on 1.0), and no body (GET and HEAD carry none)."""
    reader = _HeadReader()
    parser = httptools.HttpRequestParser(reader)
    upgrade = False
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        upgrade = True  # Upgrade: or CONNECT: answered as any other, then closed (what follows is not HTTP)
    except httptools.HttpParserCallbackError as exc:
        cause = exc.__context__
        raise cause if isinstance(cause, BadRequest) else BadRequest(400, "bad request") from None
    except httptools.HttpParserError as exc:
        raise BadRequest(400, f"bad request: {exc}") from None
    headers = reader.headers
    if not reader.complete or "transfer-encoding" in headers or headers.get("content-length", "0").lstrip("0"):
        raise BadRequest(400, "request bodies are not accepted")  # (llhttp stops at CONNECT's head)
    if not reader.url:  # llhttp lets CONNECT through without one
        raise BadRequest(400, "bad request target")
    start = 0
    while head.startswith(b"\r\n", start):  # empty lines before a request line are allowed
        start += 2
    if head[start:start + 1] in (b"\r", b"\n"):  # an empty line ended by LF alone (llhttp skips it)
        raise BadRequest(400, "bad request: lines must end with CRLF")
    line_end = head.find(b"\r\n", start)
    if head.count(b" ", start, line_end) != 2:  # llhttp lets "GET  /" through; the grammar has one SP
        raise BadRequest(400, "bad request line")
    version = head[line_end - 9:line_end]
    if version[6:] != parser.get_http_version().encode():  # "GET HTTP/1.0": llhttp reads 0.9, that URL
        raise BadRequest(400, "bad request line")
    if version == b" HTTP/1.1":
        if reader.hosts != 1:
            raise BadRequest(400, "HTTP/1.1 needs exactly one Host header")
        keep_alive = not upgrade and "close" not in headers.get("connection", "").lower()
    elif version == b" HTTP/1.0":
        if reader.hosts > 1:
            raise BadRequest(400, "more than one Host header")
        keep_alive = not upgrade and "keep-alive" in headers.get("connection", "").lower()
    else:
        raise BadRequest(400, "only HTTP/1.0 and HTTP/1.1")
    path, query = split_target(reader.url.decode("latin-1"))
    return Head(parser.get_method().decode("latin-1"), path, query, headers, keep_alive)


def split_target(target: str) -> tuple[str, str]:
    """(path, query) of an origin-form (``/p?q``) or absolute-form (``http://h/p?q``) target;
    any other form comes back as a path no route has (answered 404). Never raises."""
    if not target.startswith("/"):
        scheme, sep, rest = target.partition("://")
        if sep and scheme.lower() in ("http", "https"):
            cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
            target = rest[cut:]
            if not target.startswith("/"):
                target = "/" + target
    target = target.partition("#")[0]
    path, _, query = target.partition("?")
    return path, query


def encode(response: Response, keep_alive: bool, with_body: bool = True) -> bytes:
    reason = responses.get(response.status, "Status")
    head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}"]
    head += [f"{name}: {value}" for name, value in response.headers]
    if not keep_alive:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (response.body if with_body else b"")
