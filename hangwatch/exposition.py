"""Numbers computed only to be exposed: one series each where the rules would otherwise read many.

They live beside the core's own definitions (``verdict.progress``, ``verdict.same_process``)
because they must agree with them, but the verdict itself never reads them.
"""
from __future__ import annotations

import hashlib
import math
import struct

from .reading import Reading
from .verdict import progress_fields


def progress_fingerprint(reading: Reading) -> int | None:
    """One number that changes whenever any of the reading's progress signals does (None: none).

    ``hangwatch_engine_progress_fingerprint``: the rules ask "did anything move" with one
    ``changes()`` over one series instead of every signal over every range. It is the first 53
    bits of BLAKE2b over the signals as little-endian doubles (absent: NaN) in the engine's
    ``progress`` order, so it is the same in every exporter process and exact in a float64; it
    moves where ``progress`` does, and also when a signal appears or vanishes (work, never a hang).
    """
    fields = progress_fields(reading.engine)
    values = [getattr(reading, name) for name in fields]
    if all(value is None for value in values):
        return None
    packed = struct.pack(f"<{len(values)}d", *(math.nan if value is None else value + 0.0 for value in values))
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little") >> 11


def counters_sum(reading: Reading) -> float | None:
    """The sum of the reading's counters (None: none), which goes back when a new process starts.

    ``hangwatch_engine_counters_total``: one ``resets()`` per target instead of one per counter.
    It misses a new process only when that one did more work by its first reading than the old
    one in its life; the progress fingerprint then moves, so the rules say busy, never hung.
    """
    counters = reading.counters()
    return sum(counters.values()) if counters else None
