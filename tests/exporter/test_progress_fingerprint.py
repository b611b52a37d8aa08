"""The progress fingerprint moves exactly when ``verdict.progress`` finds engine work.

The rules decide "no progress across three readings" from ``changes()`` of the exporter's
``hangwatch_engine_progress_fingerprint`` alone (rules/render.py ``progress_expr``), so the
fingerprint must change between two readings of one process whenever any progress signal
moved, and stay put when none did. Where a signal appears or vanishes it changes although
``progress`` sees nothing: the rules then see work (busy), never less than Python does.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from hangwatch.engines import ENGINES
from hangwatch.exporter.collector import render_series, series_for
from hangwatch.exposition import progress_fingerprint
from hangwatch.observation import Observation
from hangwatch.reading import Reading
from hangwatch.verdict import progress

ENGINES_WITH_PROGRESS = [engine for engine in ENGINES if engine.progress]
# (A present value is drawn as one, never by filtering out None: filtering a third of the draws
# of several signals tripped Hypothesis' filter_too_much health check on some seeds.)
PRESENT = st.one_of(st.integers(0, 10**12).map(float), st.floats(0, 1e15, allow_nan=False))
SIGNAL = st.one_of(st.none(), PRESENT)


def reading(engine: str, values: dict) -> Reading:
    return Reading(engine=engine, running=1.0, waiting=0.0, **values)


@st.composite
def two_readings(draw):
    """Two readings of one process: counters never go back, the gauge moves freely, and some
    signals stay as they were (most moves in practice touch one or two signals)."""
    spec = draw(st.sampled_from(ENGINES_WITH_PROGRESS))
    before, after = {}, {}
    for name in spec.progress:
        old = draw(SIGNAL)
        before[name] = old
        if old is None or draw(st.booleans()):
            after[name] = old
        elif name == "kv_cache_usage":
            after[name] = draw(st.floats(0, 1, allow_nan=False))
        else:
            after[name] = old + draw(st.sampled_from([0.0, 1.0, 0.5, 1e-3, 4096.0]))
    return spec.name, before, after


@settings(max_examples=400, deadline=None)
@given(two_readings())
def test_the_fingerprint_changes_exactly_when_a_progress_signal_moved(case):
    engine, before, after = case
    a, b = reading(engine, before), reading(engine, after)
    moved = progress(a, b)
    fa, fb = progress_fingerprint(a), progress_fingerprint(b)
    if all(value is None for value in before.values()):
        assert fa is None and fb is None and not moved
        return
    assert (fa != fb) == bool(moved), (moved, before, after)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ENGINES_WITH_PROGRESS), st.data())
def test_a_signal_appearing_or_vanishing_moves_the_fingerprint(spec, data):
    values = {name: data.draw(PRESENT) for name in spec.progress}
    gone = data.draw(st.sampled_from(spec.progress))
    full, partial = reading(spec.name, values), reading(spec.name, {**values, gone: None})
    assert not progress(full, partial) and not progress(partial, full)
    assert progress_fingerprint(full) != progress_fingerprint(partial)


def test_an_engine_without_progress_signals_has_no_fingerprint_series():
    fastchat = Reading(engine="fastchat", running=2.0, waiting=0.0)
    assert progress_fingerprint(fastchat) is None
    names = [s.name for s in series_for(Observation(0.0, "ok", reading=fastchat), "fastchat_worker", 0.01)]
    assert "hangwatch_engine_progress_fingerprint" not in names
    vllm = Reading(engine="vllm", running=2.0, waiting=0.0)  # a page with none of the signals
    assert progress_fingerprint(vllm) is None


def test_the_fingerprint_is_the_same_number_in_another_process_and_exact_in_a_float64():
    """Two exporter processes (replicas, a restart) must expose the same value for the same
    reading, else a restart of the exporter would look like engine work; and the value must
    survive the text format and Prometheus' float64 unchanged."""
    values = {"steps": 5123.0, "prompt_tokens": 812.0, "generation_tokens": 20480.0,
              "prefix_cache_queries": 812.0, "finished": 12.0, "kv_cache_usage": 0.031}
    here = progress_fingerprint(reading("vllm", values))
    code = ("from hangwatch.reading import Reading; from hangwatch.exposition import progress_fingerprint; "
            f"print(progress_fingerprint(Reading(engine='vllm', running=1.0, waiting=0.0, **{values!r})))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}, timeout=60).stdout
    assert int(there) == here
    assert 0 <= here < 2**53 and float(here) == here
    text = render_series(series_for(Observation(0.0, "ok", reading=reading("vllm", values)), "backend", 0.01))
    line = next(line for line in text.decode().splitlines()
                if line.startswith("hangwatch_engine_progress_fingerprint "))
    exposed = float(line.split()[1])
    assert exposed == here and not math.isnan(exposed)


COUNTER = st.integers(0, 10**9).map(float)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ENGINES_WITH_PROGRESS), st.data())
def test_the_counters_sum_goes_back_only_for_a_new_process_and_for_every_new_process_behind_the_old(spec, data):
    """The rules see a restart (no start time) where the sum of the counters went back: never for
    one process (``same_process`` agrees), always when the new process' counters are each at most
    the old ones and one is lower (a new process that has not out-worked the old one)."""
    from hangwatch.exposition import counters_sum
    from hangwatch.verdict import same_process
    counters = [name for name in spec.progress if name != "kv_cache_usage"]
    old = {name: data.draw(COUNTER) for name in counters}
    grown = {name: value + data.draw(COUNTER) for name, value in old.items()}
    behind = {name: data.draw(st.integers(0, int(value)).map(float)) for name, value in old.items()}
    a = reading(spec.name, old)
    assert counters_sum(reading(spec.name, grown)) >= counters_sum(a)
    assert same_process(a, reading(spec.name, grown))
    if behind != old:
        assert counters_sum(reading(spec.name, behind)) < counters_sum(a)
        assert not same_process(a, reading(spec.name, behind))
