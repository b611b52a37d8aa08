"""The one wall-clock moment a whole reading must be done by.

A leaf of the core: the client and every face share one ``Deadline`` type, and it lives beside
none of them (it once cut the ``connect``↔``fetch`` circle of issue 34).
"""
from __future__ import annotations

import time

__all__ = ["Deadline"]


class Deadline:
    """One wall-clock moment (``time.monotonic``) by which a whole reading must be done."""

    __slots__ = ("at",)

    def __init__(self, at: float):
        self.at = at

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.at - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.left() <= 0

    def __repr__(self) -> str:
        return f"Deadline(left={self.left():.3f}s)"
