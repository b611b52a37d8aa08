"""What one look at a target found: plain data shared by the observers, the verdict and the faces.

Kept apart from the code that does the looking (``observe``, ``client``) so that the verdict —
a pure function over observations — imports no network code, and so that tests can build
observations directly from the truth-table scenarios.
"""
from __future__ import annotations

from dataclasses import dataclass

from .reading import Reading

# How a request ended (``client.Fetched.status``) and how a target answered (``Observation.status``):
# one set of names for both. A fetch ends OK, REFUSED, UNREACHABLE, TIMEOUT, HTTP_ERROR, TOO_LARGE
# or BROKEN; an observation is OK, BLIND, REFUSED, UNREACHABLE or TIMEOUT (``observe.not_answered``).
OK, REFUSED, UNREACHABLE, TIMEOUT = "ok", "refused", "unreachable", "timeout"
HTTP_ERROR, TOO_LARGE, BROKEN = "http_error", "too_large", "broken"
BLIND = "blind"

# How the idle probe ended (ProbeResult.outcome). Only FAILED can ever count toward "hung":
# a 4xx (REJECTED) means the API server refused the request before the engine saw it — a
# missing API key, a model that cannot do completions — which proves nothing about the engine.
PROBE_ANSWERED, PROBE_FAILED, PROBE_REJECTED = "answered", "failed", "rejected"

# What the idle probe asks for (a target's ``probe`` setting). ``auto``: a completion of one
# token, or one embedding when the server says the model cannot do completions.
PROBE_AUTO, PROBE_COMPLETION, PROBE_EMBEDDING, PROBE_NONE = "auto", "completion", "embedding", "none"
PROBE_KINDS = (PROBE_AUTO, PROBE_COMPLETION, PROBE_EMBEDDING, PROBE_NONE)


@dataclass(frozen=True)
class ProbeResult:
    outcome: str                 # answered | failed | rejected
    duration: float
    detail: str                  # one line a person can act on; never holds a secret
    model: str | None = None
    kind: str = PROBE_COMPLETION  # what was asked: completion | embedding | worker_generate
    http_status: int | None = None

    @property
    def success(self) -> bool:
        return self.outcome == PROBE_ANSWERED

    @property
    def failed(self) -> bool:
        return self.outcome == PROBE_FAILED

    @property
    def rejected(self) -> bool:
        return self.outcome == PROBE_REJECTED

    def as_dict(self) -> dict:
        return {"outcome": self.outcome, "success": self.success, "duration": self.duration,
                "detail": self.detail, "kind": self.kind, "http_status": self.http_status}


@dataclass(frozen=True)
class Options:
    """How to look at one target: set per target in a config, or by ``hangwatch check`` flags."""

    engine: str | None = None      # skip detection: vllm | llamacpp | sglang | tgi
    api_key: str | None = None     # the backend's own API key, sent as a Bearer token to it only
    probe: str = PROBE_AUTO        # auto | completion | embedding | none
    stall_window: float | None = None  # seconds: this target's own stall window (None: the engine's)

    def __repr__(self) -> str:  # never print the key
        return (f"Options(engine={self.engine!r}, api_key={'set' if self.api_key else None}, "
                f"probe={self.probe!r}, stall_window={self.stall_window!r})")

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class Observation:
    taken_at: float                  # time.monotonic() when the reading was taken
    status: str                      # ok | blind | refused | unreachable | timeout
    reading: Reading | None = None
    error: str = ""
    probe: ProbeResult | None = None
    scrape_seconds: float = 0.0
    detail: str = ""                 # what a target without a load reading said (a controller)
    listed_models: tuple[str, ...] | None = None  # models a fleet's front lists as registered

    @property
    def answered(self) -> bool:
        """The server answered HTTP at all (even if the page was unusable)."""
        return self.status in (OK, BLIND)

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "detail": self.detail,
            "listed_models": None if self.listed_models is None else list(self.listed_models),
            "reading": self.reading.as_dict() if self.reading else None,
            "probe": None if self.probe is None else self.probe.as_dict(),
        }
