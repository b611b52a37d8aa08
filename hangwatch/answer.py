"""How a backend's answer is read, and how every request ends.

The framing (status, Content-Length, chunked, keep-alive, 1xx) is llhttp's, through
``httptools.HttpResponseParser``, fed each piece as it arrives. What is kept here is what a
reading needs on top of it: bounds, so a hostile answer cannot grow memory (a head at most
64 KiB and 100 header lines; a chunked body's framing at most 64 KiB beyond its data), the body
limit, and what an answer cut off by the server's close means. ``ENDINGS`` turns every way a
request can end into the outcome the verdict core knows, each with one message.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import httptools

from .observation import BROKEN, HTTP_ERROR, OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE

MAX_PAGE_BYTES = 8 * 1024 * 1024
MAX_ERROR_BODY = 2048
USER_AGENT = "hangwatch"
MAX_HEAD = 65536      # bytes before the final head ends (interim 1xx heads included)
MAX_HEADERS = 100     # header lines in those heads
# An answer's bytes that are not body data (its head; a chunked body's sizes, extensions and
# trailer) at most MAX_HEAD + MAX_FRAMING + the data's own size: framing cannot outgrow its page.
MAX_FRAMING = 65536


@dataclass(frozen=True)
class Fetched:
    status: str
    body: bytes = b""
    http_status: int | None = None
    error: str = ""
    elapsed: float = 0.0
    content_type: str = ""

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


# ending -> (the outcome, its one message). ``{why}`` is the error's own words (``short_error``).
ENDINGS: dict[str, tuple[str, str]] = {
    "ok": (OK, ""),
    "http_error": (HTTP_ERROR, "HTTP {http_status}"),
    "refused": (REFUSED, "connection refused"),
    "unreachable": (UNREACHABLE, "connection failed: {why}"),
    "connect_timeout": (UNREACHABLE, "connect to {host}:{port} timed out after {budget:g}s"),
    "no_time": (TIMEOUT, "no time left in the {budget:g}s budget"),
    "silent": (TIMEOUT, "connection accepted, no answer within {budget:g}s"),
    "slow_answer": (TIMEOUT, "answer not complete within {budget:g}s"),
    "closed": (BROKEN, "connection closed without an answer: {why}"),
    "broken_off": (BROKEN, "answer broken off: {why}"),
    "too_large": (TOO_LARGE, "answer exceeds {max_bytes} bytes"),
}


def ended(ending: str, started: float, *, http_status: int | None = None, body: bytes = b"",
          content_type: str = "", **words) -> Fetched:
    """The one place a request's ending becomes a ``Fetched``: its outcome and message from ``ENDINGS``."""
    status, message = ENDINGS[ending]
    return Fetched(status, body=body, http_status=http_status, error=message.format(http_status=http_status, **words),
                   elapsed=time.monotonic() - started, content_type=content_type)


class BadAnswer(Exception):
    """The answer cannot be read (its framing is in doubt, or it is past a bound)."""


class Answer:
    """One answer, fed as its bytes arrive; ``complete`` once it is whole, ``over`` once its body
    passed ``limit`` (``max_bytes``; an HTTP error's body is kept ``MAX_ERROR_BODY`` long)."""

    def __init__(self, max_bytes: int, head_only: bool = False):
        self.max_bytes, self.head_only = max_bytes, head_only
        self.parser = httptools.HttpResponseParser(self)
        # Real servers are read as http.client read them, which reads what llhttp would refuse: a
        # bare LF, spaces after a chunk size, any HTTP/1.x version, header values with any byte,
        # chunked beside a Content-Length.
        self.parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_chunked_length=True, lenient_version=True,
            lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True)
        self.status: int | None = None   # the final answer's, once its head is read
        self.content_type = ""
        self.parts: list[bytes] = []    # the body as it came (joined once, by ``body``: one piece is not copied)
        self.size = 0                    # the body's bytes so far
        self.limit = max_bytes
        self.complete = self.keep_alive = self.over = False
        self.chunked = False             # said by the head (Transfer-Encoding: chunked)
        self.fed = 0                     # bytes fed to the parser
        self.headers = 0                 # header lines in the heads so far

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status is not None:
            return  # a chunked body's trailer: bounded as its framing
        self.headers += 1
        if self.headers > MAX_HEADERS:  # (raised through llhttp, which stops here: see ``_parse``)
            raise BadAnswer(f"answer head over {MAX_HEADERS} header lines")
        name = name.strip().lower()
        if name == b"content-type" and not self.content_type:
            self.content_type = value.strip().decode("iso-8859-1")
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        if self.complete:
            return  # stray bytes after the answer, read as the next one: not ours
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100, 103): its head is dropped, the final one follows
            self.content_type, self.chunked = "", False
            return
        self.status = status
        self.limit = self.max_bytes if status < 300 else MAX_ERROR_BODY
        self.keep_alive = self.parser.should_keep_alive()
        if self.head_only:
            self.complete, self.keep_alive = True, False

    def on_body(self, data: bytes) -> None:
        if self.complete:
            return
        # Kept as it came: a page that arrives whole is never copied again (growing a bytearray
        # copies it, and a fresh block of its size is often fresh pages from the kernel).
        self.parts.append(data)
        self.size += len(data)
        self.over = self.size > self.limit

    def on_message_complete(self) -> None:
        if self.status is not None:
            self.complete = True

    # -- bytes in ------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Feed what arrived (raises ``BadAnswer``)."""
        if self.status is None:  # what is fed is head until the final head ends: at most MAX_HEAD
            room = MAX_HEAD - self.fed
            head, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self._parse(head)
            if self.status is None:
                if data:
                    raise BadAnswer(f"answer head over {MAX_HEAD} bytes")
                return
        if data and not (self.complete or self.over):
            self._parse(data)
            if self.fed - self.size > MAX_HEAD + MAX_FRAMING + self.size:
                raise BadAnswer(f"chunked framing over {MAX_FRAMING} bytes beyond its data")

    def _parse(self, data: bytes) -> None:
        self.fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # a bound of ours, raised in a callback
            raise exc.__context__ from None
        except httptools.HttpParserUpgrade:
            raise BadAnswer("an upgrade is no answer") from None
        except httptools.HttpParserError as exc:
            if not self.complete:  # (past the answer's end, stray bytes: the answer stands)
                raise BadAnswer(str(exc) or type(exc).__name__) from None

    def eof(self) -> None:
        """The server closed: an answer read to its close is whole. One cut short: a body short of
        its Content-Length is what came (as http.client reads it), a chunked one is broken."""
        if self.complete or self.status is None:
            return
        if self.chunked:
            raise BadAnswer("chunked body cut off")
        self.complete, self.keep_alive = True, False

    def release(self) -> None:
        """Drop the parser, once the answer is read: it refers back to this answer (its
        callbacks), a cycle that only the garbage collector would free, page and all — later,
        and in a fresh block of memory for every page meanwhile."""
        self.parser = None

    def body(self) -> bytes:
        """The body read so far, in one piece."""
        return b"".join(self.parts)
