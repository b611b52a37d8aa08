"""The answer to a loop GET, framed from the bytes as they arrive, as ``http.client`` frames it
(Content-Length, chunked, read-to-close; HTTP/1.0 keep-alive rules; at most 100 header lines; every
status, header, chunk-size and trailer line at most 64 KiB, so a line that never ends is a broken
answer, not a buffer that grows), with the body limit checked at the points ``fetch.Client`` checks
it: a backend read on the loop ends exactly as one read on a thread.
"""
from __future__ import annotations

import re
import time

from hangwatch.fetch import HTTP_ERROR, MAX_ERROR_BODY, OK, TOO_LARGE, Fetched

MAX_LINE = 65536       # http.client's _MAXLINE
MAX_HEADER_LINES = 100  # http.client's _MAXHEADERS (the blank line counts)
READ_SIZE = 65536       # fetch.Client reads the body in these steps; the limit is checked at each

_HEADER = re.compile(r"[\041-\071\073-\176]*:")  # email.feedparser's header line (a name, then ':')


class BadAnswer(Exception):
    """What ``http.client`` raises as an HTTPException: the answer cannot be framed."""


class RemoteDisconnected(ConnectionResetError):
    """As http.client.RemoteDisconnected: closed before any byte of an answer."""


class AnswerReader:
    """The answer half of ``LoopGet``: head, framing, body. ``LoopGet`` supplies the connection
    (``landing``, ``_lost``, ``_fail``, ``_end``) and the state these methods keep."""

    def _head(self, data) -> None:
        """The status line and headers, line by line from a read position: the rest of the
        buffer is never copied per line. A read that starts an answer is read where it landed
        (``data`` is the start of ``LoopClient.landing``): the page is copied once, into the body."""
        eof = not data
        if self.buffer or not isinstance(data, memoryview):
            buffer = self.buffer
            buffer += data
            limit = len(buffer)
        else:
            buffer, limit = data.obj, len(data)  # the landing's bytes; ``data`` is its first ``limit``
        pos = 0
        while True:
            end = buffer.find(b"\n", pos, limit)
            if end == -1:
                if limit - pos > MAX_LINE:
                    raise BadAnswer("got more than 65536 bytes when reading "
                                     + ("status line" if self.status is None else "header line"))
                if not eof:
                    self.buffer = bytearray(buffer[pos:limit])  # the unfinished line, for the next bytes
                    return
                line, pos = bytes(buffer[pos:limit]), limit
            else:
                if end + 1 - pos > MAX_LINE:
                    raise BadAnswer("got more than 65536 bytes when reading "
                                     + ("status line" if self.status is None else "header line"))
                line, pos = bytes(buffer[pos:end + 1]), end + 1
            if self.status is None:
                if not line:
                    self._lost(RemoteDisconnected("Remote end closed connection without response"))
                    return
                self._status_line(line)
                continue
            self.header_lines += 1
            if self.header_lines > MAX_HEADER_LINES:
                raise BadAnswer(f"got more than {MAX_HEADER_LINES} headers")
            if line in (b"\r\n", b"\n", b""):
                if self.status == 100:  # skip an interim 100 Continue, as http.client does
                    self.status, self.headers, self.header_lines, self.headers_ended = None, {}, 0, False
                    if eof and pos >= limit:
                        self._lost(RemoteDisconnected("Remote end closed connection without response"))
                        return
                    continue
                self._framing()
                self.buffer = bytearray()  # what is left of ``buffer`` is the body's
                self._body(memoryview(buffer)[pos:limit], eof=eof)
                return
            self._header(line.decode("iso-8859-1"))

    def _status_line(self, raw: bytes) -> None:
        line = raw.decode("iso-8859-1")
        parts = line.split(None, 2)
        version = parts[0] if len(parts) >= 2 else ""
        if not version.startswith("HTTP/"):
            raise BadAnswer(line)
        try:
            status = int(parts[1])
        except ValueError:
            raise BadAnswer(line) from None
        if status < 100 or status > 999:
            raise BadAnswer(line)
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        elif status != 100:
            raise BadAnswer(version)
        self.status = status

    def _header(self, line: str) -> None:
        """As ``email.parser`` reads headers for http.client: the first of a name counts; a line
        that is no header ends them (the rest is ignored); a folded line continues one."""
        if self.headers_ended or line[:1] in (" ", "\t"):
            return
        if not _HEADER.match(line):
            self.headers_ended = True
            return
        name, _, value = line.partition(":")
        self.headers.setdefault(name.lower(), value.strip())

    def _framing(self) -> None:
        headers, status = self.headers, self.status
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        connection = headers.get("connection", "").lower()
        if self.version == 11:
            will_close = "close" in connection
        else:
            will_close = not (headers.get("keep-alive") or "keep-alive" in connection
                              or "keep-alive" in headers.get("proxy-connection", "").lower())
        length = None
        if headers.get("content-length") and not self.chunked:
            try:
                length = int(headers["content-length"])
            except ValueError:
                length = None
            else:
                if length < 0:
                    length = None
        if status in (204, 304) or 100 <= status < 200:
            length = 0
        if not will_close and not self.chunked and length is None:
            will_close = True
        self.will_close, self.left = will_close, length
        self.limit = self.max_bytes if status < 300 else MAX_ERROR_BODY
        self.body = bytearray()
        self.mark = READ_SIZE  # the next point at which fetch.Client looks at the size
        self.chunk_left: int | None = None  # chunked: bytes left in this chunk (None: read a size line)
        self.trailer = False
        self.state = self.BODY

    def _body(self, data, eof: bool | None = None) -> None:
        eof = (not data) if eof is None else eof
        extra = False  # bytes past the answer's end: the connection is not reused
        if self.chunked:
            self.buffer += data
            ended = self._dechunk(eof)
            extra = bool(self.buffer)
        elif self.left is not None:
            take = data[:self.left]
            extra = len(data) > len(take)
            if not self.body and len(take) == self.left:
                self.body = bytes(take)  # all of it at once (the usual case): one copy, kept as is
            else:
                self.body += take
            self.left -= len(take)
            ended = self.left == 0
            if not ended and eof:
                # As fetch.Client (http.client's read(amt) does not raise on a short read): what
                # came is the answer, and the parser finds a page cut in a line unreadable.
                ended, extra = True, True
        else:
            self.body += data
            ended = eof
        if self._over_limit(ended):
            return
        if ended:
            self._complete(clean=not extra)

    def _dechunk(self, eof: bool) -> bool:
        """Move whole chunks from ``buffer`` into ``body``; True at the last chunk's trailer end."""
        buffer = self.buffer
        while True:
            if self.trailer:  # (read and dropped as http.client does, each line at most MAX_LINE)
                end = buffer.find(b"\n", 0, MAX_LINE)
                if end == -1:
                    if len(buffer) > MAX_LINE:
                        raise BadAnswer("got more than 65536 bytes when reading trailer line")
                    if eof:
                        return True  # http.client: the trailer ends at EOF too
                    return False
                line = bytes(buffer[:end + 1])
                del buffer[:end + 1]
                if line in (b"\r\n", b"\n"):
                    return True
                continue
            if self.chunk_left is None:
                end = buffer.find(b"\n", 0, MAX_LINE)
                if end == -1:
                    if len(buffer) > MAX_LINE:
                        raise BadAnswer("got more than 65536 bytes when reading chunk size")
                    if eof:
                        raise BadAnswer("IncompleteRead(0 bytes read)")
                    return False
                line = bytes(buffer[:end + 1]).split(b";", 1)[0]
                del buffer[:end + 1]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise BadAnswer("IncompleteRead(0 bytes read)") from None
                if size == 0:
                    self.trailer = True
                    continue
                self.chunk_left = size
            if self.chunk_left > 0:
                take = buffer[:self.chunk_left]
                self.body += take
                del buffer[:len(take)]
                self.chunk_left -= len(take)
                if self.chunk_left > 0:
                    if eof:
                        raise BadAnswer(f"IncompleteRead({len(self.body)} bytes read)")
                    return False
            if len(buffer) < 2:  # the CRLF after a chunk's data
                if eof:
                    raise BadAnswer(f"IncompleteRead({len(self.body)} bytes read)")
                return False
            del buffer[:2]
            self.chunk_left = None

    def _over_limit(self, ended: bool) -> bool:
        """fetch.Client reads 64 KiB at a time and checks the size after each read: same points here."""
        while len(self.body) >= self.mark or ended:
            size = min(len(self.body), self.mark)
            if size > self.limit:
                if self.status < 300:
                    self._fail(TOO_LARGE, f"answer exceeds {self.max_bytes} bytes", self.status)
                else:
                    self._end(Fetched(HTTP_ERROR, body=bytes(self.body[:self.limit]), http_status=self.status,
                                      error=f"HTTP {self.status}", elapsed=time.monotonic() - self.started,
                                      content_type=self._content_type()), keep=False)
                return True
            if ended and len(self.body) < self.mark:
                return False
            self.mark += READ_SIZE
        return False

    def _content_type(self) -> str:
        return self.headers.get("content-type", "")

    def _complete(self, clean: bool) -> None:
        elapsed = time.monotonic() - self.started
        keep = clean and not self.will_close
        body = bytes(self.body)  # (no copy when it is bytes already)
        if self.status >= 300:
            fetched = Fetched(HTTP_ERROR, body=body[:self.limit], http_status=self.status, error=f"HTTP {self.status}",
                              elapsed=elapsed, content_type=self._content_type())
        else:
            fetched = Fetched(OK, body=body, http_status=self.status, elapsed=elapsed,
                              content_type=self._content_type())
        self._end(fetched, keep=keep)
