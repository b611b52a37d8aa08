"""Alertmanager's webhook payload (version 4) → a few small ``Alert`` values, or ``BadPayload``.

Only what the decision uses is checked strictly (``version``, ``alerts[].status``,
``labels``, ``startsAt``); anything else Alertmanager adds is ignored. A shape we cannot
trust is a 400 with a short reason: Alertmanager does not retry 4xx, and a retry would not
make a bad payload good. Label values are untrusted text: they are only ever compared
with the config, never used to name a container.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

MAX_ALERTS = 1000
MAX_LABEL_BYTES = 64 * 1024
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$")


class BadPayload(ValueError):
    """Why the body is not a usable v4 payload (short, safe to return to the sender)."""


@dataclass(frozen=True)
class Alert:
    status: str                  # firing | resolved
    labels: dict                 # str -> str
    starts_at: datetime | None   # aware, UTC

    @property
    def firing(self) -> bool:
        return self.status == "firing"

    def label(self, name: str) -> str | None:
        return self.labels.get(name)


def parse_rfc3339(text: str) -> datetime:
    """RFC 3339 with any number of fractional digits (Go writes nanoseconds) → aware UTC."""
    match = _RFC3339.match(text)
    if not match:
        raise ValueError(f"not an RFC 3339 time: {text[:40]!r}")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    if zone in ("Z", "z"):
        offset = timezone.utc
    else:
        sign = 1 if zone[0] == "+" else -1
        offset = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micro,
                    tzinfo=offset).astimezone(timezone.utc)


def parse_payload(body: bytes) -> list[Alert]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise BadPayload("body is not JSON") from None
    if not isinstance(data, dict):
        raise BadPayload("body must be a JSON object")
    if data.get("version") != "4":
        raise BadPayload('version must be "4" (Alertmanager webhook payload v4)')
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise BadPayload("alerts: must be a list")
    if len(alerts) > MAX_ALERTS:
        raise BadPayload(f"alerts: more than {MAX_ALERTS}")
    return [_alert(raw, f"alerts[{i}]") for i, raw in enumerate(alerts)]


def _alert(raw, path: str) -> Alert:
    if not isinstance(raw, dict):
        raise BadPayload(f"{path}: must be an object")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise BadPayload(f"{path}.status: must be firing or resolved")
    labels = raw.get("labels")
    if not isinstance(labels, dict):
        raise BadPayload(f"{path}.labels: must be an object")
    size = 0
    for key, value in labels.items():
        if not isinstance(value, str):
            raise BadPayload(f"{path}.labels: values must be strings")
        size += len(key) + len(value)
    if size > MAX_LABEL_BYTES:
        raise BadPayload(f"{path}.labels: too large")
    starts_at = raw.get("startsAt")
    if starts_at is None and status == "resolved":
        return Alert(status, dict(labels), None)
    if not isinstance(starts_at, str):
        raise BadPayload(f"{path}.startsAt: must be an RFC 3339 time")
    try:
        parsed = parse_rfc3339(starts_at)
    except (ValueError, OverflowError):
        raise BadPayload(f"{path}.startsAt: must be an RFC 3339 time") from None
    return Alert(status, dict(labels), parsed)
