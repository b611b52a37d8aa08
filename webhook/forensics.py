"""Ask the forensics place for the stacks of a target about to be restarted, within a deadline.

The webhook cannot read a server's processes (it runs apart, with only Docker's socket), so it
asks the exporter that can (``GET /forensics?target=URL`` at the target's ``forensics_url``)
once the re-check has said hung and nothing vetoes the restart. Whatever comes back — the
capture, a 409 (the exporter did not judge it hung), an error, nothing within the deadline — is
put into the incident; the restart never waits longer than the deadline for it.
"""
from __future__ import annotations

import json

import requests

MAX_BYTES = 8 * 1024 * 1024  # a capture of many processes is large; more than this is cut off


def ask(forensics_url: str, target_url: str, timeout: float) -> dict:
    """The exporter's capture (its JSON answer), or ``{"signature": None, "errors": [why]}``."""
    try:
        with requests.get(f"{forensics_url.rstrip('/')}/forensics", params={"target": target_url},
                          timeout=(min(5.0, timeout), timeout), stream=True) as response:
            body = response.raw.read(MAX_BYTES + 1, decode_content=True)
    except requests.Timeout:
        return failed(f"the capture at {forensics_url} did not answer within {timeout:g}s")
    except requests.RequestException as exc:
        return failed(f"the capture at {forensics_url} failed: {type(exc).__name__}")
    if len(body) > MAX_BYTES:
        return failed(f"the capture at {forensics_url} answered more than {MAX_BYTES} bytes")
    try:
        answer = json.loads(body)
    except ValueError:
        return failed(f"the capture at {forensics_url} answered HTTP {response.status_code}, not JSON")
    if not isinstance(answer, dict):
        return failed(f"the capture at {forensics_url} answered HTTP {response.status_code}, not a JSON object")
    if response.status_code != 200:
        why = (answer.get("errors") or [f"HTTP {response.status_code}"])[0]
        return failed(f"the capture at {forensics_url} answered HTTP {response.status_code}: {str(why)[:300]}") | {
            "verdict": answer.get("verdict")}
    return answer


def failed(why: str) -> dict:
    return {"signature": None, "captured": False, "processes": [], "errors": [why]}
