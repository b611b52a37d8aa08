"""Fetch one page from a backend within a time budget and a size cap, and say how it failed.

How a request fails is itself the reading: refused means the port is closed (down, perhaps
loading weights); accepted-but-silent means the process is wedged (hung if it repeats).
So the failure is classified here, once, for every caller.
"""
from __future__ import annotations

import errno
import time
from dataclasses import dataclass

import requests

MAX_PAGE_BYTES = 8 * 1024 * 1024  # a real vLLM page is ~55 KB
USER_AGENT = "hangwatch"

# Why a fetch produced no page.
OK, REFUSED, UNREACHABLE, TIMEOUT, HTTP_ERROR, TOO_LARGE = (
    "ok", "refused", "unreachable", "timeout", "http_error", "too_large")


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


def _refused(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
            return True
        if "Connection refused" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__ or (exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None)
    return False


def request(session: requests.Session, method: str, url: str, *, timeout: float,
            max_bytes: int = MAX_PAGE_BYTES, json: dict | None = None) -> Fetched:
    """One HTTP request whose whole answer must arrive within ``timeout`` seconds."""
    started = time.monotonic()
    deadline = started + timeout
    try:
        response = session.request(method, url, json=json, stream=True, timeout=(timeout, timeout),
                                   headers={"User-Agent": USER_AGENT}, allow_redirects=False)
    except requests.exceptions.ConnectTimeout:
        return Fetched(UNREACHABLE, error=f"connect to {url} timed out after {timeout:g}s",
                       elapsed=time.monotonic() - started)
    except requests.exceptions.ReadTimeout:
        return Fetched(TIMEOUT, error=f"connection accepted, no answer within {timeout:g}s",
                       elapsed=time.monotonic() - started)
    except requests.exceptions.ConnectionError as exc:
        status = REFUSED if _refused(exc) else UNREACHABLE
        message = "connection refused" if status == REFUSED else f"connection failed: {_short(exc)}"
        return Fetched(status, error=message, elapsed=time.monotonic() - started)
    except requests.exceptions.RequestException as exc:
        return Fetched(UNREACHABLE, error=f"request failed: {_short(exc)}", elapsed=time.monotonic() - started)
    with response:
        chunks, size = [], 0
        try:
            for chunk in response.iter_content(chunk_size=65536):
                size += len(chunk)
                if size > max_bytes:
                    return Fetched(TOO_LARGE, http_status=response.status_code,
                                   error=f"answer exceeds {max_bytes} bytes", elapsed=time.monotonic() - started)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    return Fetched(TIMEOUT, http_status=response.status_code,
                                   error=f"answer not complete within {timeout:g}s",
                                   elapsed=time.monotonic() - started)
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            if isinstance(exc.__context__, TimeoutError) or "timed out" in str(exc):
                return Fetched(TIMEOUT, http_status=response.status_code,
                               error=f"answer stalled for {timeout:g}s", elapsed=time.monotonic() - started)
            return Fetched(HTTP_ERROR, http_status=response.status_code,
                           error=f"answer broken off: {_short(exc)}", elapsed=time.monotonic() - started)
        body = b"".join(chunks)
    elapsed = time.monotonic() - started
    content_type = response.headers.get("Content-Type", "")
    if response.status_code >= 300:
        return Fetched(HTTP_ERROR, body=body[:2048], http_status=response.status_code,
                       error=f"HTTP {response.status_code}", elapsed=elapsed, content_type=content_type)
    return Fetched(OK, body=body, http_status=response.status_code, elapsed=elapsed, content_type=content_type)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
