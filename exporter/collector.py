"""What ``/probe`` exposes for one observation of one target, and its text, with nothing kept.

The prober (``prober.Prober``) observes the target through its module, then asks
``BackendCollector.series`` for the normalized series (``series_for``, the one definition)
and writes them with ``render_series``: plain tuples straight to the text format, no
prometheus_client objects per probe. Rates and "no progress for N seconds" are PromQL's job,
which keeps two Prometheus replicas scraping one exporter correct; a failed backend is data
(``hangwatch_up 0``), never an HTTP error.

Sample output for a busy vLLM::

    hangwatch_up 1.0
    hangwatch_connection_stalled 0.0
    hangwatch_metrics_available 1.0
    hangwatch_requests_running 4.0
    hangwatch_requests_waiting 0.0
    hangwatch_requests_in_flight 4.0
    hangwatch_requests_schedulable 4.0
    hangwatch_requests_deferred 0.0
    hangwatch_engine_steps_total 5123.0
    hangwatch_engine_tokens_total{kind="prompt"} 812.0
    hangwatch_engine_tokens_total{kind="generation"} 20480.0
    hangwatch_prefix_cache_queries_total 812.0
    hangwatch_requests_finished_total 12.0
    hangwatch_kv_cache_usage_ratio 0.031
    hangwatch_engine_output_total 20492.0
    hangwatch_engine_preemptions_total 0.0
    hangwatch_engine_counters_total 27251.0
    hangwatch_engine_progress_fingerprint 5.445924108713651e+15
    hangwatch_process_start_time_seconds 1.7644e+09
    hangwatch_engine_asleep 0.0
    hangwatch_probe_failed 0.0
    hangwatch_probe_rejected 0.0
    hangwatch_model_served{model="tiny"} 1.0
    hangwatch_scrape_duration_seconds 0.0021
    hangwatch_backend_info{engine="vllm",models="tiny",module="backend",version="0.32.0"} 1.0
"""
from __future__ import annotations

import time
from typing import NamedTuple

from prometheus_client.utils import floatToGoString

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.exposition import counters_sum, progress_fingerprint
from hangwatch.modules import module as module_named
from hangwatch.observation import TIMEOUT, Observation, Options
from hangwatch.observe import engine_version, version_due
from hangwatch.reading import bounded_models

_COUNTERS = (
    ("steps", "hangwatch_engine_steps", "Engine iterations (the engine's heartbeat)."),
    ("prefix_cache_queries", "hangwatch_prefix_cache_queries",
     "Prefix-cache queries; jumps when a prefill is scheduled."),
    ("finished", "hangwatch_requests_finished", "Requests the engine finished."),
)


class Series(NamedTuple):
    """One family as plain data, which ``render_series`` writes directly."""

    name: str
    doc: str
    kind: str                                  # gauge | counter
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]  # (label values, value)


_new_series = tuple.__new__  # a namedtuple's own __new__ is a Python call more, ×25 per probe


def _gauge(name: str, doc: str, value: float) -> Series:
    return _new_series(Series, (name, doc, "gauge", (), (((), value),)))


def _counter(name: str, doc: str, value: float) -> Series:
    return _new_series(Series, (name, doc, "counter", (), (((), value),)))


def series_for(observation: Observation, module: str, duration: float, version: str | None = None,
               stall_window: float | None = None):
    """The normalized series for one observation: the one definition of what /probe exposes.
    ``version``: the engine's, when known (else the reading's own, if it has one);
    ``stall_window``: the target's own, when its config sets one."""
    yield _gauge("hangwatch_up", "1 if the backend answered HTTP within the budget.",
                 1.0 if observation.answered else 0.0)
    yield _gauge("hangwatch_connection_stalled",
                 "1 if the connection was accepted but no answer came within the budget.",
                 1.0 if observation.status == TIMEOUT else 0.0)
    reading = observation.reading
    reads_load = module_named(module).reads_load
    if reads_load:
        yield _gauge("hangwatch_metrics_available", "1 if the backend's /metrics gave a usable reading.",
                     1.0 if reading is not None else 0.0)
    if reading is not None:
        yield _gauge("hangwatch_requests_running", "Requests the engine is processing.", reading.running)
        yield _gauge("hangwatch_requests_waiting", "Requests queued in the engine.", reading.waiting)
        yield _gauge("hangwatch_requests_in_flight", "Running plus waiting requests.", reading.in_flight)
        yield _gauge("hangwatch_requests_schedulable",
                     "Requests in flight the engine itself can work on (in flight minus deferred).",
                     reading.schedulable)
        if reading.deferred is not None:
            yield _gauge("hangwatch_requests_deferred",
                         "Waiting requests the engine defers on something outside it (a KV transfer, a LoRA "
                         "budget).", reading.deferred)
        for field, name, doc in _COUNTERS:
            if getattr(reading, field) is not None:
                yield _counter(name, doc, getattr(reading, field))
        if reading.prompt_tokens is not None or reading.generation_tokens is not None:
            tokens = []
            if reading.prompt_tokens is not None:
                tokens.append((("prompt",), reading.prompt_tokens))
            if reading.generation_tokens is not None:
                tokens.append((("generation",), reading.generation_tokens))
            yield Series("hangwatch_engine_tokens", "Tokens processed by the engine.", "counter", ("kind",),
                         tuple(tokens))
        if reading.kv_cache_usage is not None:
            yield _gauge("hangwatch_kv_cache_usage_ratio", "KV-cache usage, 0 to 1.", reading.kv_cache_usage)
        output = reading.output()
        if output is not None:
            yield _counter("hangwatch_engine_output", "Output: tokens out and requests answered (not aborted, "
                           "not failed), summed over the engine's output signals; flat with requests in flight "
                           "is a stall.", output)
        if reading.preemptions is not None:
            yield _counter("hangwatch_engine_preemptions", "Requests preempted (KV evicted) to make room.",
                           reading.preemptions)
        if stall_window is not None:
            yield _gauge("hangwatch_stall_window_seconds", "This target's own stall window (its config's "
                         "stall_window); absent: the engine's default in the rules.", stall_window)
        total = counters_sum(reading)
        if total is not None:
            yield _counter("hangwatch_engine_counters", "The sum of the engine's counters above: it goes back "
                           "when a new process starts them from zero (the rules' one series for a restart "
                           "without a start time).", total)
        fingerprint = progress_fingerprint(reading)
        if fingerprint is not None:
            yield _gauge("hangwatch_engine_progress_fingerprint",
                         "Changes whenever one of the engine's progress signals does (a hash of them): "
                         "the rules' one series for engine work.", float(fingerprint))
        if reading.process_start is not None:
            yield _gauge("hangwatch_process_start_time_seconds",
                         "The backend process' start time (seconds since the epoch).", reading.process_start)
        yield _gauge("hangwatch_engine_asleep", "1 if the engine is asleep (weights offloaded).",
                     1.0 if reading.asleep else 0.0)
    if reads_load:
        # Present in every reading (0 when no probe was sent), so the rules can tell "failed in
        # the last two readings" from "failed, then busy, then failed". Only a failed probe (no
        # answer in time, broken, 5xx) can count toward hung; a rejected one (4xx) never does.
        probe = observation.probe
        yield _gauge("hangwatch_probe_failed", "1 if this reading's idle probe was sent and failed "
                     "(no answer in time, broken, 5xx).", 1.0 if probe is not None and probe.failed else 0.0)
        yield _gauge("hangwatch_probe_rejected", "1 if this reading's idle probe was rejected with a 4xx "
                     "(e.g. no API key): it proves nothing about the engine.",
                     1.0 if probe is not None and probe.rejected else 0.0)
    if observation.probe is not None:
        yield _gauge("hangwatch_probe_success", "1 if the idle 1-token probe answered (sent only at idle).",
                     1.0 if observation.probe.success else 0.0)
        yield _gauge("hangwatch_probe_duration_seconds", "How long the idle probe took.", observation.probe.duration)
    yield from _model_series(observation)
    yield _gauge("hangwatch_scrape_duration_seconds", "How long reading this backend took.", duration)
    yield Series("hangwatch_backend_info", "What was found at the target.", "gauge",
                 ("engine", "module", "models", "version"),
                 (((reading.engine if reading else "", module,
                    ",".join(bounded_models(reading.models)) if reading else "",
                    (version or reading.version or "") if reading else ""), 1.0),))


def _model_series(observation: Observation):
    """Which models a backend serves, and which a fleet's front lists as registered (one series each).

    A FastChat controller lists model names only, so "a member dropped while it still serves"
    is a join on ``model`` between the two (rules/hangwatch-fleet.yml).
    """
    if observation.reading is not None and observation.reading.models:
        yield Series("hangwatch_model_served", "1 for each model the backend serves.", "gauge", ("model",),
                     tuple(((model,), 1.0) for model in bounded_models(observation.reading.models)))
    if observation.answered and observation.listed_models is not None:
        yield _gauge("hangwatch_fleet_models_registered",
                     "Models a fleet's controller lists as registered (a FastChat front).",
                     float(len(observation.listed_models)))
        if observation.listed_models:
            yield Series("hangwatch_fleet_model_registered",
                         "1 for each model a fleet's controller lists as registered.", "gauge", ("model",),
                         tuple(((model,), 1.0) for model in bounded_models(observation.listed_models)))


class BackendCollector:
    """One probe's series for one target: its observation plus the engine's version.

    The version is asked within the probe's one deadline, and only when ``versions`` (optional,
    ``exporter.reuse.VersionCache``) does not know it for this process and is not backing off an
    unread one: a busy backend is asked one request per scrape, not two. No reading is kept between scrapes.
    """

    def __init__(self, target: str, module: str, budget: float, options: Options = Options(),
                 client: Client | None = None, versions=None):
        self.target, self.module, self.budget, self.options = target, module, budget, options
        self.client = client or Client(max_idle=0)
        self.versions = versions
        self.last_observation: Observation | None = None

    def known_version(self, observation: Observation) -> str | None:
        """The engine's version if ``versions`` knows it for this reading's process."""
        reading = observation.reading
        if reading is None or not self.versions:
            return None
        return self.versions.get(self.target, reading.engine, reading.process_start)

    async def series(self, observation: Observation, started: float, deadline: Deadline,
                     version: str | None = None):
        """The series for an observation taken since ``started``, with the engine's version
        (``version`` when the caller has it, else asked within ``deadline`` unless ``versions``
        knows it or is backing off)."""
        reading = observation.reading
        if reading is not None and not version:
            version = self.known_version(observation)
            if not version and not self.backing_off(observation):
                version = await engine_version(self.client, self.target.rstrip("/"), reading.engine, deadline,
                                               self.options)
                if self.versions is not None:
                    self.versions.put(self.target, reading.engine, reading.process_start, version)
        self.last_observation = observation
        return series_for(observation, self.module, time.monotonic() - started, version, self.options.stall_window)

    def version_asks(self, observation: Observation, deadline: Deadline, known: str | None) -> bool:
        """True when ``series`` would send a request: ``known`` (what ``known_version`` said for
        this observation) is None and the engine has a version endpoint, with time left to ask."""
        reading = observation.reading
        return (reading is not None and not known and not self.backing_off(observation)
                and version_due(reading.engine, deadline))

    def backing_off(self, observation: Observation) -> bool:
        """True while this process's version could not be read and is not to be asked yet."""
        reading = observation.reading
        return (reading is not None and self.versions is not None
                and self.versions.backing_off(self.target, reading.engine, reading.process_start))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# (name, kind, doc) -> its HELP and TYPE lines, and the name its samples are exposed under.
# Bounded by the families series_for defines (their docs are constants).
_HEADERS: dict[tuple[str, str, str], tuple[str, str]] = {}
# (label names, label values) -> their text between the braces. The same few per target each
# scrape (its engine, models, version), so it is kept; emptied when it reaches _MAX_PAIRS.
_PAIRS: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
_MAX_PAIRS = 65536


def _go_float(value: float) -> str:
    """``floatToGoString(value)``: Python's repr, except a positive number with a dot past
    position 6 (Go's exponent form: a counter past a million, a start time; about ten per busy
    probe) and inf/nan (rare: left to prometheus_client). ``render_series`` inlines it."""
    text = repr(value) if type(value) is float else repr(float(value))
    dot = text.find(".")
    if dot > 6:
        return f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.") + f"e+{dot - 1:02d}" if value > 0 else text
    return floatToGoString(value) if "n" in text else text


def _header(name: str, kind: str, doc: str) -> tuple[str, str]:
    exposed = name + "_total" if kind == "counter" else name
    escaped = doc.replace("\\", "\\\\").replace("\n", "\\n")
    header = _HEADERS[(name, kind, doc)] = (f"# HELP {exposed} {escaped}\n# TYPE {exposed} {kind}\n", exposed)
    return header


def _pairs(labels: tuple[str, ...], values: tuple[str, ...]) -> str:
    if len(_PAIRS) >= _MAX_PAIRS:
        _PAIRS.clear()
    pairs = _PAIRS[(labels, values)] = ",".join(f'{key}="{_label_value(label)}"'
                                                for key, label in sorted(zip(labels, values)))
    return pairs


def render_series(all_series) -> bytes:
    """The text exposition format of ``Series``: byte for byte what prometheus_client's
    ``generate_latest`` writes for the same families (tests/exporter/test_render_matches_prometheus_client.py)."""
    out = []
    append = out.append
    headers, known_pairs = _HEADERS, _PAIRS
    for name, doc, kind, labels, samples in all_series:
        header, exposed = headers.get((name, kind, doc)) or _header(name, kind, doc)
        append(header)
        for values, value in samples:
            text = repr(value) if type(value) is float else repr(float(value))  # (_go_float, inlined)
            dot = text.find(".")
            if dot > 6:
                if value > 0:
                    text = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.") + f"e+{dot - 1:02d}"
            elif "n" in text:
                text = floatToGoString(value)
            if labels:
                pairs = known_pairs.get((labels, values)) or _pairs(labels, values)
                append(f"{exposed}{{{pairs}}} {text}\n")
            else:
                append(f"{exposed} {text}\n")
    return "".join(out).encode("utf-8")
