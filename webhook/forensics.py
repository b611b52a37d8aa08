"""Ask the forensics place for the stacks of a target about to be restarted, within one deadline.

The webhook cannot read a server's processes (it runs apart, with only Docker's socket), so it
asks the exporter that can (``GET /forensics?target=URL&container=ID`` at the target's
``forensics_url``: the container ID Docker gave, so the exporter takes that container's own
processes) once the re-check has said hung and nothing vetoes the restart. The answer lands in
an incident record and a label, so the client trusts nothing: no redirect is followed, no proxy
is taken from the environment (plain ``http.client``), one wall-clock deadline covers connect,
head and body (a server dripping a byte at a time cannot stretch it: the socket is shut at the
deadline), the body is capped, and a ``signature`` outside the signature table is ``invalid``.
Whatever comes back — the capture, a 409, an error, nothing in time — goes into the incident;
the restart never waits longer than the deadline for it.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlencode, urlsplit

from hangwatch.forensics.signatures import NAMES

MAX_BYTES = 8 * 1024 * 1024  # a capture of many processes is large; more than this is cut off
INVALID = "invalid"


def ask(forensics_url: str, target_url: str, timeout: float, *, token: str | None = None,
        container: str | None = None) -> dict:
    """The exporter's capture (its JSON answer), or ``{"signature": None, "errors": [why]}``."""
    parts = urlsplit(forensics_url)
    query = {"target": target_url} | ({"container": container} if container else {})
    path = f"{parts.path.rstrip('/')}/forensics?{urlencode(query)}"
    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=timeout)
    expired = threading.Event()
    watchdog = threading.Timer(timeout, _shut, (connection, expired))
    watchdog.daemon = True
    began = time.monotonic()
    watchdog.start()
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        status = response.status
        body = bytearray()
        while len(body) <= MAX_BYTES:
            chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
            if not chunk:
                break
            body += chunk
            if time.monotonic() - began > timeout:
                raise TimeoutError
    except (OSError, http.client.HTTPException, TimeoutError, ValueError) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError) or time.monotonic() - began >= timeout:
            return failed(f"the capture at {forensics_url} did not answer within {timeout:g}s")
        return failed(f"the capture at {forensics_url} failed: {type(exc).__name__}")
    finally:
        watchdog.cancel()
        connection.close()
    if len(body) > MAX_BYTES:
        return failed(f"the capture at {forensics_url} answered more than {MAX_BYTES} bytes")
    if 300 <= status < 400:
        return failed(f"the capture at {forensics_url} answered a redirect (HTTP {status}); not followed")
    try:
        answer = json.loads(bytes(body))
    except ValueError:
        return failed(f"the capture at {forensics_url} answered HTTP {status}, not JSON")
    if not isinstance(answer, dict):
        return failed(f"the capture at {forensics_url} answered HTTP {status}, not a JSON object")
    if status != 200:
        errors = answer.get("errors")
        why = errors[0] if isinstance(errors, list) and errors else f"HTTP {status}"
        return failed(f"the capture at {forensics_url} answered HTTP {status}: {str(why)[:300]}") | {
            "verdict": str(answer.get("verdict"))[:32] if answer.get("verdict") is not None else None}
    return checked(answer)


def checked(answer: dict) -> dict:
    """A signature is a label and a policy key: only a name from the table (else ``invalid``)."""
    signature = answer.get("signature")
    if signature is not None and signature not in NAMES:
        answer = answer | {"signature": INVALID,
                           "errors": [*(answer.get("errors") or [])[:100],
                                      "the capture named a signature outside the signature table: invalid"]}
    return answer


def _shut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The deadline: whatever the exchange is doing (connecting, a dripping head or body), it ends now."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def failed(why: str) -> dict:
    return {"signature": None, "captured": False, "processes": [], "errors": [why]}
