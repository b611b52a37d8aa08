"""Each scenario step served as a real page and observed the way production observes it.

The truth table's readings are not built as ``Observation`` objects by hand: every step's
values become an engine's /metrics page (named from the engine table, ``hangwatch.engines``)
served on a real socket (``tests.support.pages.PageServer``), and the step is observed through
``hangwatch.modules`` — the page reader, ``observe_load`` and its idle-confirm wait, the probe —
exactly as ``hangwatch check``, the exporter, the webhook's re-check and ``/livez`` do. Whether
an idle probe went out is seen at the server (a POST to the probe route), never computed here.

A step's ``probe`` field says how the server answers a probe if one comes (``ok`` by default);
``refused`` is a port held bound but never listening; ``timeout`` a server that accepts and
never answers; ``blind`` a /metrics that answers 404.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from dataclasses import dataclass, replace

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.engines import ENGINES_BY_NAME
from hangwatch.modules import module as module_named
from hangwatch.observation import Observation, Options
from harness.ports import closed_port
from tests.support.pages import Page, PageServer

from .scenarios import Scenario, Step, load_all

MODEL = "truth-table-model"
READING_DEADLINE = 2.0   # one observation's budget on an answering server (the idle wait is 0.25 s of it)
SILENT_DEADLINE = 0.3    # a server that never answers: the observation ends at its deadline
# Scenario step keys -> the engine table's normalized fields.
COUNTERS = {"steps": "steps", "prompt": "prompt_tokens", "gen": "generation_tokens",
            "prefix": "prefix_cache_queries", "finished": "finished", "served": "served",
            "preempted": "preemptions", "decodes": "decodes"}
GAUGES = {"kv": "kv_cache_usage"}
PROBE_ROUTES = {("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("POST", "/worker_generate")}
PROBE_STATUS = {"ok": 200, "fail": 500, "rejected": 401}


@dataclass(frozen=True)
class Served:
    """What production saw for one step: its observation (None: no scrape) and the probe
    requests the server received while it was observed."""

    observation: Observation | None
    probes_received: int
    declared_probe: str | None  # the step's own ``probe:`` field, if it has one


def metrics_page(engine: str, values: dict) -> bytes:
    """The step's values as ``engine``'s /metrics page (None: the engine exports no such series)."""
    spec = ENGINES_BY_NAME[engine]
    lines = []

    def family(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value!r}" for labels, value in samples)

    model = f'{{model_name="{MODEL}"}}' if spec.model_label else ""
    running, waiting = float(values.get("running") or 0), float(values.get("waiting") or 0)
    if running or waiting or "running" not in spec.absent_is_zero:
        family(spec.running[0], "gauge", [(model, running)])
        family(spec.waiting[0], "gauge", [(model, waiting)])
    counters: dict[str, list[tuple[dict, float]]] = {}  # family -> (labels, value)
    for key, field in COUNTERS.items():
        if values.get(key) is not None and field in spec.counters:
            labels = {"model_name": MODEL} if spec.model_label else {}
            wanted = spec.label_filters.get(field)
            if wanted is not None:  # a sample the field counts: a kept value, or one not dropped
                labels[wanted.label] = wanted.keep[0] if wanted.keep else "stop"
            counters.setdefault(spec.counters[field][0], []).append((labels, float(values[key])))
    for name, samples in counters.items():
        if len(samples) == 2:  # one family, two fields (vLLM: finished, and served = not aborted)
            (plain, total), (kept, part) = sorted(samples, key=lambda s: len(s[0]))
            label = next(k for k in kept if k not in plain)
            dropped = next(f for f in spec.label_filters.values() if f.label == label).drop
            samples = [(kept, part), ({**plain, label: dropped[0]}, total - part)]
        family(name, "counter", [("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "",
                                  value) for labels, value in samples])
    for key, field in GAUGES.items():
        if values.get(key) is not None and field in spec.gauges:
            family(spec.gauges[field][0], "gauge", [(model, float(values[key]))])
    if values.get("start") is not None and spec.process_start:
        family(spec.process_start[0], "gauge", [("", float(values["start"]))])
    if spec.sleep_state:
        name, label, awake = spec.sleep_state
        family(name, "gauge", [(f'{{{label}="{awake}"}}', 0.0 if values.get("asleep") else 1.0)])
    if spec.deferred and values.get("deferred") is not None:
        name, label, wanted = spec.deferred
        family(name, "gauge", [(f'{{{label}="{wanted}"}}', float(values["deferred"]))])
    return ("\n".join(lines) + "\n").encode()


def _json(data: dict, status: int = 200) -> Page:
    return Page(json.dumps(data).encode(), status=status, content_type="application/json")


def _serve_step(server: PageServer, scenario: Scenario, step: Step, answer: str) -> None:
    """Point the server's routes at this step's state."""
    server.pages.clear()
    if step.status == "timeout":
        for path in ("/metrics", "/v1/models", "/worker_get_status"):
            server.pages[path] = Page(silent=True)
        return
    status = PROBE_STATUS[answer]
    server.pages["/v1/models"] = _json({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
    server.pages["/v1/completions"] = _json({"choices": [{"text": "x"}]} if status == 200 else {"error": "x"}, status)
    if step.status == "blind":
        server.pages["/metrics"] = Page(b"not found", status=404)
    elif scenario.engine == "fastchat":
        in_flight = int((step.values.get("running") or 0) + (step.values.get("waiting") or 0))
        server.pages["/worker_get_status"] = _json({"model_names": [MODEL], "speed": 1, "queue_length": in_flight})
        server.pages["/worker_generate"] = _json({"text": "x", "error_code": 0} if status == 200
                                                 else {"text": "x", "error_code": 50001}, status)
    else:
        server.pages["/metrics"] = Page(metrics_page(scenario.engine, step.values))


def module_for(scenario: Scenario) -> str:
    """The module production would use: a FastChat worker is read as one (it has no /metrics)."""
    return "fastchat_worker" if scenario.engine == "fastchat" and scenario.module == "backend" else scenario.module


def served(name: str) -> tuple[Served, ...]:
    """Every step of scenario ``name`` observed through production's observer."""
    return served_all()[name]


@functools.lru_cache(maxsize=None)
def served_all() -> dict[str, tuple[Served, ...]]:
    """Every scenario, each on its own server and all at once: a scenario's readings are
    sequential and mostly wait (the idle-confirm wait is 0.25 s per idle step; one scenario has
    43), so side by side the whole table takes as long as its longest scenario. Cached per
    process: the Python and promtool truth tables both read it."""
    scenarios = load_all()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        return dict(zip((s.name for s in scenarios), pool.map(_observe_scenario, scenarios)))


def _observe_scenario(scenario: Scenario) -> tuple[Served, ...]:
    observe = module_named(module_for(scenario)).observe
    options = Options(engine=None if scenario.engine == "fastchat" else scenario.engine)
    server, client, refused = PageServer(), Client(), f"http://127.0.0.1:{closed_port()}"
    out = []
    try:
        for step in scenario.steps:
            declared = step.declared_probe
            if not step.scraped:
                out.append(Served(None, 0, declared))
                continue
            _serve_step(server, scenario, step, declared or "ok")
            before = sum(1 for request in server.requests if request in PROBE_ROUTES)
            url = refused if step.status == "refused" else server.url
            deadline = Deadline.after(SILENT_DEADLINE if step.status == "timeout" else READING_DEADLINE)
            observation = asyncio.run(observe(client, url, deadline, options, clock=lambda: step.time))
            observation = replace(observation, taken_at=step.time)
            received = sum(1 for request in server.requests if request in PROBE_ROUTES) - before
            out.append(Served(observation, received, declared))
    finally:
        client.close()
        server.stop()
    return tuple(out)
