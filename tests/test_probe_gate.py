"""The idle-probe gate, as a unit: ``observe_load`` with scripted readings and a recording prober.

The behaviour tests (``test_idle_confirm``: real pages that change between the two readings;
``test_check_simulator`` and ``webhook/test_recheck_simulator``: the simulator asleep or busy;
the truth table: every scenario step served) see the gate from the server's side. These pin
each rule of it alone, with nothing else moving, so a mistake in one rule cannot hide behind
another: the probe goes out only after a second reading, only if that one is idle too, only if
the engine did no work between them, never to an asleep engine, never while anything is in
flight, never to a target set to ``probe: none``.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observation import BLIND, OK, PROBE_ANSWERED, PROBE_NONE, Observation, Options, ProbeResult
from hangwatch.observe import observe_load
from hangwatch.reading import Reading

IDLE = Reading(engine="vllm", running=0, waiting=0, steps=100, generation_tokens=50, process_start=1000.0)


def scripted(*readings: Reading | Observation):
    """A load reader answering ``readings`` in order (an Observation as it is, a Reading as
    OK), and a prober; both record their calls in ``calls``."""
    calls: list[str] = []
    queue = list(readings)

    async def read(client, url, deadline, options, taken_at):
        calls.append("read")
        item = queue.pop(0)
        return item if isinstance(item, Observation) else Observation(taken_at, OK, reading=item)

    async def probe(client, url, deadline, options):
        calls.append("probe")
        return ProbeResult(PROBE_ANSWERED, 0.01, "answered")

    return read, probe, calls


def observe(*readings, options: Options = Options()):
    read, probe, calls = scripted(*readings)
    observation = asyncio.run(observe_load(Client(), "http://127.0.0.1:9", Deadline.after(2), options, read=read,
                                           probe=probe))
    return observation, calls


def test_two_idle_readings_then_one_probe():
    observation, calls = observe(IDLE, IDLE)
    assert calls == ["read", "read", "probe"] and observation.probe is not None


def test_a_second_reading_with_work_in_flight_gets_no_probe_and_is_what_is_told():
    busy = Reading(engine="vllm", running=1, waiting=0, steps=100, generation_tokens=50, process_start=1000.0)
    observation, calls = observe(IDLE, busy)
    assert calls == ["read", "read"] and observation.probe is None
    assert observation.reading.in_flight == 1  # the newer reading is the one judged


def test_a_second_reading_that_could_not_be_read_gets_no_probe():
    observation, calls = observe(IDLE, Observation(0.0, BLIND, error="/metrics answered HTTP 500"))
    assert calls == ["read", "read"] and observation.status == BLIND and observation.probe is None


@pytest.mark.parametrize("moved", ["steps", "generation_tokens"])
def test_engine_work_between_the_two_idle_readings_gets_no_probe(moved):
    after = Reading(**{**IDLE.__dict__, moved: getattr(IDLE, moved) + 1})
    observation, calls = observe(IDLE, after)
    assert calls == ["read", "read"] and observation.probe is None


def test_a_restart_between_the_two_readings_is_not_work_and_is_probed():
    """Counters going back with a new start time are a new process, not progress to compare."""
    restarted = Reading(engine="vllm", running=0, waiting=0, steps=1, generation_tokens=0, process_start=2000.0)
    observation, calls = observe(IDLE, restarted)
    assert calls == ["read", "read", "probe"]


@pytest.mark.parametrize("first", [
    Reading(engine="vllm", running=1, waiting=0),
    Reading(engine="vllm", running=0, waiting=2),
    Reading(engine="vllm", running=0, waiting=0, asleep=True),
], ids=["running", "waiting", "asleep"])
def test_work_in_flight_or_asleep_is_read_once_and_never_probed(first):
    observation, calls = observe(first)
    assert calls == ["read"] and observation.probe is None


def test_asleep_at_the_second_reading_is_never_probed():
    observation, calls = observe(IDLE, Reading(engine="vllm", running=0, waiting=0, asleep=True))
    assert calls == ["read", "read"] and observation.probe is None


def test_probe_none_reads_once_and_never_probes():
    observation, calls = observe(IDLE, options=Options(probe=PROBE_NONE))
    assert calls == ["read"] and observation.probe is None


def test_a_kv_gauge_falling_between_the_two_readings_is_work_and_gets_no_probe():
    """A gauge moves both ways (the KV cache empties as requests finish): either way is work."""
    before = Reading(**{**IDLE.__dict__, "kv_cache_usage": 0.5})
    after = Reading(**{**IDLE.__dict__, "kv_cache_usage": 0.4})
    observation, calls = observe(before, after)
    assert calls == ["read", "read"] and observation.probe is None


def test_the_second_reading_comes_the_confirmation_interval_after_the_first():
    """The interval is the rule's point (a request still being received shows only later): the
    two readings are at least most of ``IDLE_CONFIRM_S`` apart (a lower bound: safe on a loaded
    machine)."""
    from hangwatch.observe import IDLE_CONFIRM_S
    times: list[float] = []
    read, probe, calls = scripted(IDLE, IDLE)

    async def timed(*args):
        times.append(time.monotonic())
        return await read(*args)
    asyncio.run(observe_load(Client(), "http://127.0.0.1:9", Deadline.after(2), Options(), read=timed, probe=probe))
    assert len(times) == 2 and times[1] - times[0] >= IDLE_CONFIRM_S * 0.9
