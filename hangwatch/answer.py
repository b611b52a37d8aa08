"""How a backend's answer is read, and how every request ends.

The framing (status, Content-Length, chunked, keep-alive, 1xx) is llhttp's, through
``httptools.HttpResponseParser``; what is kept here is what a reading needs on top of it:
``http.client``'s limits (every status, header, chunk-size and trailer line at most 64 KiB, at
most 100 header lines), so a line that never ends is a broken answer and not a buffer that grows;
the body limit; and what an answer cut off by the server's close means. ``ENDINGS`` turns every
way a request can end into the outcome the verdict core knows, each with one message.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import httptools

from .observation import BROKEN, HTTP_ERROR, OK, REFUSED, TIMEOUT, TOO_LARGE, UNREACHABLE

MAX_PAGE_BYTES = 8 * 1024 * 1024
MAX_ERROR_BODY = 2048
USER_AGENT = "hangwatch"
MAX_LINE = 65536        # http.client's _MAXLINE: a line with its newline may be this long, no longer
MAX_HEADER_LINES = 100  # http.client's _MAXHEADERS (the blank line that ends them counts)
_CONTENT_TYPE = b"content-type:"


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
    """The answer cannot be read (``http.client`` would raise an HTTPException)."""


class Answer:
    """One answer, fed as its bytes arrive; ``complete`` once it is whole.

    While the parser reads lines (the head; a chunked body's size lines, the CRLF after each
    chunk's data and the trailer) ``feed`` hands it one line at a time, so each is measured
    exactly; a chunk's data and a body framed by its length or the close go in whole. Body
    bytes count against ``limit`` (``max_bytes``; an HTTP error's body is kept ``MAX_ERROR_BODY`` long)."""

    def __init__(self, max_bytes: int, head_only: bool = False):
        self.max_bytes, self.head_only = max_bytes, head_only
        self.parser = self._new_parser()
        self.status: int | None = None   # the final answer's, once its head is read
        self.content_type = ""
        self.parts: list[bytes] = []    # the body as it came (joined once, by ``body``: one piece is not copied)
        self.size = 0                    # the body's bytes so far
        self.limit = max_bytes
        self.complete = self.keep_alive = self.over = self.received = False
        self.chunked = False             # said by the head (Transfer-Encoding: chunked)
        self._lines = True               # the parser is reading lines
        self._line = 0                   # bytes of the current line so far
        self._head_line = bytearray()    # the current line (a head's, or a chunk size's first 64 bytes)
        self._bad_line = ""              # why the current line cannot be read (raised at its end)
        self._chunk_size = 0
        self._head_lines = 0
        self._data_left = 0              # a chunk's data bytes not yet fed (known from its size line)
        self._chunk_header = self._trailer = False

    def _new_parser(self) -> httptools.HttpResponseParser:
        parser = httptools.HttpResponseParser(self)
        # http.client reads what llhttp would refuse: a bare LF, spaces after a chunk size,
        # any HTTP/1.x version, header values with any byte, chunked beside a Content-Length.
        parser.set_dangerous_leniencies(lenient_headers=True, lenient_chunked_length=True, lenient_version=True,
                                        lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True)
        return parser

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100, 103): its head is dropped, the final one follows
            self._head_lines, self.content_type, self.chunked = -1, "", False
            return
        self.status = status
        self.limit = self.max_bytes if status < 300 else MAX_ERROR_BODY
        self.keep_alive = self.parser.should_keep_alive()
        self._lines = self.chunked
        if self.head_only:
            self.complete, self.keep_alive = True, False

    def on_body(self, data: bytes) -> None:
        # Kept as it came: a page that arrives whole is never copied again (growing a bytearray
        # copies it, and a fresh block of its size is often fresh pages from the kernel).
        self.parts.append(data)
        self.size += len(data)
        self.over = self.size > self.limit

    def release(self) -> None:
        """Drop the parser, once the answer is read: it refers back to this answer (its
        callbacks), a cycle that only the garbage collector would free, page and all — later,
        and in a fresh block of memory for every page meanwhile."""
        self.parser = None

    def body(self) -> bytes:
        """The body read so far, in one piece."""
        return b"".join(self.parts)

    def on_chunk_header(self) -> None:
        self._chunk_header = True

    def on_message_complete(self) -> None:
        if self.status is not None:
            self.complete = True

    # -- bytes in ------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Feed what arrived (raises ``BadAnswer``); stops at the answer's end or past the limit."""
        self.received = True
        pos = self._whole_head(data) if self.status is None and not (self._head_lines or self._line or self._bad_line) else 0
        view, size = memoryview(data), len(data)
        while pos < size and not (self.complete or self.over):
            if self._data_left:
                take = min(self._data_left, size - pos)
                self._data_left -= take
                self._parse(view[pos:pos + take])
                pos += take
            elif not self._lines:
                self._parse(view[pos:] if pos else data)
                return
            else:
                end = data.find(b"\n", pos, pos + MAX_LINE + 1 - self._line)
                stop = size if end < 0 else end + 1
                before = self.size
                self._chunk_header = False
                self._parse(view[pos:stop])
                self._count_line(view[pos:stop], self.size - before, end >= 0)
                pos = stop

    def _whole_head(self, data: bytes) -> int:
        """The usual head — a final answer's, all in ``data``, within every limit, lines ended by
        CRLF — fed in one piece: where it ends. 0 (anything else, or whatever llhttp refuses in
        it): it is read line by line, with a fresh parser, to be measured and named exactly."""
        end = data.find(b"\r\n\r\n", 0, MAX_LINE)  # (so no line of it can be longer than MAX_LINE)
        if end < 0 or not data.startswith(b"HTTP/1.") or data[9:10] not in (b"2", b"3", b"4", b"5"):
            return 0
        head = data[:end + 4]
        if b"\n\n" in head or head.find(b"\n\r\n") != end + 1 or head.count(b"\n") > MAX_HEADER_LINES:
            return 0
        lines = head.split(b"\n")
        for line in lines:
            self._header(line)
        try:
            self.parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.parser = self._new_parser()
            self.status, self.limit, self.content_type = None, self.max_bytes, ""
            self.complete = self.keep_alive = self.chunked = False
            self._lines = True
            return 0
        self._head_lines = len(lines) - 1
        return end + 4

    def _parse(self, piece) -> None:
        if self._bad_line:
            return  # the unreadable line is read to its end first, as http.client reads lines
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            raise BadAnswer("an upgrade is no answer") from None
        except httptools.HttpParserError as exc:
            if self.status is not None:  # only a chunked body can be unreadable: as http.client words it
                self._bad_line = self._incomplete()
            elif self._head_lines == 0:
                self._bad_line = "status"  # http.client's BadStatusLine quotes the line
            else:
                self._bad_line = str(exc) or type(exc).__name__
            if not self._lines:
                raise BadAnswer(self._bad_line) from None

    def _incomplete(self) -> str:
        """http.client's words for a chunked body cut short: the whole chunks of its last read."""
        whole = self.size - (self._chunk_size - self._data_left if self._data_left else 0)
        return f"IncompleteRead({whole % 65536} bytes read)"

    def _count_line(self, piece, body_bytes: int, ended: bool) -> None:
        size = len(piece) - body_bytes
        self._line += size
        if self.status is None or self._line <= 64:
            self._head_line += piece[len(piece) - size:] if size else b""
        if self._line > MAX_LINE:
            raise BadAnswer(f"got more than {MAX_LINE} bytes when reading {self._line_kind()}")
        if not ended:
            return
        line, length, self._line, self._head_line = bytes(self._head_line), self._line, 0, bytearray()
        if self._bad_line:
            raise BadAnswer(line.decode("iso-8859-1") if self._bad_line == "status" else self._bad_line)
        if self.status is None:
            self._head_lines += 1
            if self._head_lines > MAX_HEADER_LINES:
                raise BadAnswer(f"got more than {MAX_HEADER_LINES} headers")
            self._header(line)
        elif self._chunk_header and length <= 64:  # its data goes to the parser whole
            words = line.split(b";", 1)[0].strip()
            self._data_left = self._chunk_size = int(words, 16) if words else 0
            self._trailer = self._data_left == 0

    def _header(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if not colon:
            return
        name = name.strip().lower()
        if name == b"content-type" and not self.content_type:
            self.content_type = value.strip().decode("iso-8859-1")
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def _line_kind(self) -> str:
        if self.status is None:
            return "status line" if self._head_lines == 0 else "header line"
        return "trailer line" if self._trailer else "chunk size"

    def eof(self) -> None:
        """The server closed: an answer read to its close is whole; one cut short is read as
        ``http.client`` reads it (a short Content-Length body is what came; a chunked one is broken)."""
        if self._bad_line:
            raise BadAnswer(bytes(self._head_line).decode("iso-8859-1") if self._bad_line == "status"
                            else self._bad_line)
        if self.complete or self.status is None:
            return
        if self.chunked and not self._trailer:
            raise BadAnswer(self._incomplete())
        self.complete, self.keep_alive = True, False
