"""What the exporter would have seen at each scenario step, and the series it would have emitted.

``observation_for`` builds the ``Observation`` that ``observe_backend``/``observe_proxy`` would
have returned for a step (the Python truth table judges these); ``exported_samples`` renders it
with the exporter's own ``families_for`` and adds what Prometheus adds (the target labels and
``up``), so the promtool truth table reads exactly the series the exporter emits, never a
hand-kept copy of them.
"""
from __future__ import annotations

from hangwatch.exporter.collector import families_for
from hangwatch.observation import Observation, ProbeResult
from hangwatch.reading import Reading

_READING = {"steps": "steps", "prompt": "prompt_tokens", "gen": "generation_tokens",
            "prefix": "prefix_cache_queries", "finished": "finished", "kv": "kv_cache_usage",
            "start": "process_start", "served": "served", "preempted": "preemptions", "decodes": "decodes"}
_PROBE_DETAIL = {"answered": "1-token completion answered", "failed": "timed out",
                 "rejected": "rejected with HTTP 401"}


def observation_for(step, module: str, engine: str = "vllm") -> Observation | None:
    """What ``observe_backend``/``observe_proxy`` would have returned for this step (None: no scrape)."""
    taken_at = float(step.time)
    if not step.scraped:
        return None  # Prometheus got no reading from the exporter: nothing to judge
    if step.status == "refused":
        return Observation(taken_at, "refused", error="connection refused")
    if step.status == "timeout":
        return Observation(taken_at, "timeout", error="connection accepted, no answer within 5s")
    if step.status == "blind":
        return Observation(taken_at, "blind", error="/metrics answered HTTP 404")
    if module == "proxy":
        return Observation(taken_at, "ok")
    v = step.values
    reading = Reading(engine=engine, running=float(v["running"]), waiting=float(v["waiting"]),
                      asleep=bool(v.get("asleep")),
                      deferred=None if v.get("deferred") is None else float(v["deferred"]),
                      **{field: (None if v.get(key) is None else float(v[key])) for key, field in _READING.items()})
    probe = None
    if step.probe is not None:
        probe = ProbeResult(step.probe, 0.01, _PROBE_DETAIL[step.probe])
    return Observation(taken_at, "ok", reading=reading, probe=probe)


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
    for family in families_for(observation, module, 0.01, stall_window):
        for sample in family.samples:
            out[series_name(sample.name, {**target_labels, **sample.labels})] = float(sample.value)
    return out
