"""What one series of a /metrics page feeds, worked out once per (engine, name, labels).

A busy page's counters move every scrape but its series stay: the same names and labels from
scrape to scrape and across a fleet's backends (``engine="0",model_name="..."``). So the label
work ``reading.parse`` needs per wanted line — splitting the pairs, the engine's label filters
(vLLM's aborted requests are no answer), the sleep state, the model's name — is done once per
series and kept; per scrape only the values are read (``bench/RESULTS-busy-spread.md``:
a busy vLLM page's parse 100 → 77 µs).
"""
from __future__ import annotations

import re

from .engines import EngineMetrics

LABEL_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

# (engine, sample name, labels) -> roles. Bounded, as a page is untrusted: only labels of at
# most KEPT_LABELS characters are kept (vLLM's are under 100), at most SERIES_KEPT series,
# emptied when full (a page's wanted lines are a few dozen, the same on every backend of one
# engine and model): a few MB at worst. Thread-safe: the webhook reads on its own thread, and a
# series worked out twice at once is worked out the same.
SERIES_KEPT = 4096
KEPT_LABELS = 512
kept_roles: dict[tuple[str, str, str], tuple[tuple[str, ...], bool, str | None]] = {}


def roles(spec: EngineMetrics, name: str, labels: str, fields: tuple[str, ...]) -> tuple[tuple[str, ...], bool, str | None]:
    """What one series (``name{labels}``, feeding ``fields`` by its name) gives: (the fields its
    value is added to, whether a 0 value means the engine sleeps, the model it names for
    ``running`` — whole, the caller cuts it — or None)."""
    pairs: dict[str, str] | None = None

    def label(wanted: str) -> str | None:
        nonlocal pairs
        if pairs is None:
            pairs = dict(LABEL_PAIR.findall(labels))
        return pairs.get(wanted)

    adds: list[str] = []
    sleeps, model = False, None
    for field_name in fields:
        if field_name == "sleep_state":
            _, sleep_label, awake = spec.sleep_state
            sleeps = sleeps or label(sleep_label) == awake
            continue
        if field_name == "deferred":
            _, deferred_label, wanted = spec.deferred
            if label(deferred_label) != wanted:
                continue
        wanted_labels = spec.label_filters.get(field_name)
        if wanted_labels is not None and not wanted_labels.admits(label(wanted_labels.label)):
            continue
        adds.append(field_name)
        if spec.model_label and labels and field_name == "running":
            model = label(spec.model_label) or None
    found = (tuple(adds), sleeps, model)
    if len(labels) <= KEPT_LABELS:
        if len(kept_roles) >= SERIES_KEPT:
            kept_roles.clear()
        kept_roles[(spec.name, name, labels)] = found
    return found
