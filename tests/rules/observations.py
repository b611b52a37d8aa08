"""The series the exporter would have emitted for each scenario step.

``exported_samples`` renders a step's observation (production's, ``served``) through the
exporter's own exposition (``tests.support.exposition.probe_text``) and adds what Prometheus adds (the target labels and ``up``),
so the promtool truth table reads exactly the series the exporter emits, never a hand-kept
copy of them.
"""
from __future__ import annotations

from hangwatch.observation import Observation
from tests.support.exposition import probe_text, samples


def series_name(name: str, labels: dict) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def exported_samples(observation: Observation | None, module: str, target_labels: dict,
                     scraped: bool = True, stall_window: float | None = None) -> dict[str, float]:
    """The samples Prometheus stores for one scrape of the exporter: its families plus ``up``.

    ``observation`` None with ``scraped``: the scrape of the exporter failed (``up`` 0, nothing
    else); not ``scraped``: no such target (nothing at all).
    """
    if not scraped:
        return {}
    out = {series_name("up", target_labels): 0.0 if observation is None else 1.0}
    if observation is None:
        return out
    for (name, labels), value in samples(probe_text(observation, module, 0.01, stall_window=stall_window)).items():
        out[series_name(name, {**target_labels, **dict(labels)})] = float(value)
    return out
