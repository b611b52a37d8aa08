"""From observations over time to one verdict: idle, busy, hung, stalled, restarted, blind or down.

The developers' truth table as a pure function, called by ``hangwatch check``, the webhook's
re-check and the truth-table tests (the Prometheus rules are tested against the same
scenarios). Only ``hung`` leads to a restart, so it is the hardest to reach: in flight and no
engine work across two intervals (and ``grace``), no answer twice in a row, or an idle probe
failed twice in a row; a rejected probe (4xx) and deferred requests never count.
``stalled`` (only with a stall window): in flight across the window and no output at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .engines import ENGINES_BY_NAME, GAUGE_FIELDS
from .observation import BLIND, OK, REFUSED, TIMEOUT, UNREACHABLE, Observation
from .reading import Reading

IDLE, BUSY, HUNG, STALLED, RESTARTED, DOWN = "idle", "busy", "hung", "stalled", "restarted", "down"
VERDICTS = (IDLE, BUSY, HUNG, STALLED, RESTARTED, BLIND, DOWN)
# Exit codes of `hangwatch check` (DESIGN.md).
EXIT_CODES = {IDLE: 0, BUSY: 0, RESTARTED: 0, HUNG: 1, BLIND: 2, DOWN: 2, STALLED: 3}


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str
    settled: bool = True  # False: another reading could change it (the checker takes one)
    answering: bool = True  # for `restarted`: did the new process answer?

    @property
    def exit_code(self) -> int:
        if self.state == RESTARTED and not self.answering:
            return 2
        return EXIT_CODES[self.state]


def same_process(before: Reading, after: Reading) -> bool:
    """Counters of two processes must never be compared: is ``after`` the same process?"""
    if before.engine != after.engine:
        return False
    if before.process_start is not None and after.process_start is not None:
        return before.process_start == after.process_start
    earlier, later = before.counters(), after.counters()
    return not any(later[name] < value for name, value in earlier.items() if name in later)


def progress_fields(engine: str) -> tuple[str, ...]:
    spec = ENGINES_BY_NAME.get(engine)
    return spec.progress if spec else ()


def min_grace(engine: str) -> float:
    """Seconds of no progress that are normal for this engine (engines.EngineMetrics.min_grace)."""
    spec = ENGINES_BY_NAME.get(engine)
    return spec.min_grace if spec else 0.0


def progress(before: Reading, after: Reading) -> list[str]:
    """The engine-work signals that moved between two readings of one process."""
    moved = []
    for name in progress_fields(after.engine):
        old, new = getattr(before, name), getattr(after, name)
        if old is None or new is None:
            continue
        if (new != old) if name in GAUGE_FIELDS else (new > old):
            moved.append(name)
    return moved


def judge(observations: Sequence[Observation], *, grace: float = 0.0,
          stall_window: float | None = None) -> Verdict:
    """The verdict the latest observation supports, given the ones before it; ``stalled`` only
    with a ``stall_window`` (seconds)."""
    if not observations:
        raise ValueError("judge() needs at least one observation")
    last = observations[-1]
    if last.status in (REFUSED, UNREACHABLE):
        return Verdict(DOWN, f"{last.error} (may be loading weights)")
    if last.status == TIMEOUT:
        streak = _trailing(observations, lambda o: o.status == TIMEOUT)
        if streak >= 2:
            return Verdict(HUNG, f"{last.error}, {streak} times in a row: the server process is wedged")
        return Verdict(DOWN, f"{last.error} (once; hung if it repeats)", settled=False)
    if last.status == BLIND:
        return Verdict(BLIND, f"{last.error}; the server answers, but its load cannot be judged")
    if last.reading is None:  # a proxy or a FastChat front: answering is all we ask of it
        return Verdict(IDLE, last.detail or "answers /v1/models (a proxy: its backends are checked directly)")
    verdict = _judge_reading(observations, grace)
    if stall_window is not None and verdict.state == BUSY:
        return _judge_output(observations, verdict, stall_window)
    return verdict


def _judge_output(observations: Sequence[Observation], busy: Verdict, window: float) -> Verdict:
    """Busy, or stalled: in flight in every reading of the last ``window`` seconds and no output.

    The stall starts at the first reading of the trailing run in which requests are in flight in
    every reading and the output (``Reading.output``) never changes from one to the next: the
    same readings the rules' ``target:hangwatch_engine_output:flat_since`` follows. Output that
    moved inside the readings settles busy; a run shorter than the window is busy, watching."""
    last = observations[-1].reading
    if last is None or last.output() is None or last.in_flight == 0:
        return busy
    start = len(observations) - 1
    while start > 0:
        before = observations[start - 1]
        if before.status != OK or before.reading is None or before.reading.in_flight == 0:
            break
        if before.reading.output() != observations[start].reading.output():
            break
        start -= 1
    flat_for = observations[-1].taken_at - observations[start].taken_at
    load = f"{last.running:g} running, {last.waiting:g} waiting" + (
        f" ({last.deferred:g} deferred)" if last.deferred else "")
    if flat_for >= window:
        return Verdict(STALLED, f"{load}, and no output (no token out, no request answered) for "
                                f"{flat_for:.1f}s across {len(observations) - start} readings, at least the "
                                f"{window:g}s stall window: requests are stuck")
    if start > 0 and (observations[start - 1].reading is not None
                      and observations[start - 1].reading.in_flight > 0):
        return Verdict(BUSY, busy.reason + "; output moved", settled=busy.settled)
    return Verdict(BUSY, f"{busy.reason}; no output for {flat_for:.1f}s of the {window:g}s stall window; watching",
                   settled=False)


def _judge_reading(observations: Sequence[Observation], grace: float) -> Verdict:
    last = observations[-1]
    reading = last.reading
    previous = observations[-2] if len(observations) >= 2 else None
    if previous is not None and previous.status == OK and previous.reading is not None \
            and not same_process(previous.reading, reading):
        how = ("process start time changed" if reading.process_start and previous.reading.process_start
               else "counters went backwards")
        if last.probe is not None and last.probe.failed:
            return Verdict(RESTARTED, f"{how}; the new process does not answer yet: {last.probe.detail}",
                           answering=False)
        answer = last.probe.detail if last.probe else f"{reading.in_flight:g} in flight"
        return Verdict(RESTARTED, f"{how}; counters of two processes are not compared ({answer})")
    if reading.asleep:
        return Verdict(IDLE, "engine is asleep (weights offloaded); not probed")
    if reading.in_flight == 0:
        return _judge_idle(observations)
    return _judge_in_flight(observations, grace)


def _judge_idle(observations: Sequence[Observation]) -> Verdict:
    last = observations[-1]
    probe = last.probe
    if probe is None:
        return Verdict(IDLE, "nothing in flight (not probed)")
    if probe.success:
        return Verdict(IDLE, f"nothing in flight; {probe.detail}")
    if probe.rejected:
        return Verdict(IDLE, f"nothing in flight; the idle probe could not verify the engine: {probe.detail} "
                             "(a rejected probe never counts toward hung)")
    streak = _trailing(observations, lambda o: o.probe is not None and o.probe.failed)
    if streak >= 2:
        return Verdict(HUNG, f"nothing in flight, yet the idle probe failed {streak} times in a row: "
                             f"{probe.detail}")
    return Verdict(IDLE, f"nothing in flight, but the idle probe failed once: {probe.detail}",
                   settled=False)


def _judge_in_flight(observations: Sequence[Observation], grace: float) -> Verdict:
    last = observations[-1]
    reading = last.reading
    previous = observations[-2] if len(observations) >= 2 else None
    load = f"{reading.running:g} running, {reading.waiting:g} waiting"
    if reading.deferred:
        load += f" ({reading.deferred:g} deferred)"
    if not progress_fields(reading.engine):
        return Verdict(BUSY, f"{load}; {reading.engine} exposes no progress counter: busy, unverified "
                             "(never restarted on this basis)")
    if previous is not None and previous.reading is not None:
        moved = progress(previous.reading, reading)
        if moved:
            return Verdict(BUSY, f"{load}; engine progressing ({', '.join(moved)} moved); not probed")
    # Walk back over the stall: work the engine itself can do, same process, nothing moved.
    start = len(observations) - 1
    while start > 0:
        before = observations[start - 1]
        if before.status != OK or before.reading is None or before.reading.schedulable == 0:
            break
        if not same_process(before.reading, observations[start].reading):
            break
        if progress(before.reading, observations[start].reading):
            break
        start -= 1
    if reading.schedulable == 0:
        return Verdict(BUSY, f"{load}: every request in flight waits on something outside the "
                             "engine (a KV transfer from a prefill node, a LoRA budget); no progress is not a "
                             "stall here (never restarted on this basis)")
    intervals = len(observations) - 1 - start
    stalled_for = last.taken_at - observations[start].taken_at
    grace = max(grace, min_grace(reading.engine))  # e.g. one long llama.cpp batch moves nothing
    if intervals >= 2 and stalled_for >= grace:
        return Verdict(HUNG, f"{load}, and no engine progress across {intervals} readings "
                             f"({stalled_for:.1f}s): the engine is wedged")
    if intervals == 0:
        return Verdict(BUSY, f"{load}; progress not measured yet", settled=False)
    if intervals >= 2:
        return Verdict(BUSY, f"{load}; no engine progress for {stalled_for:.1f}s, within the "
                             f"{grace:g}s grace ({reading.engine}: one step can take that long); watching",
                       settled=False)
    return Verdict(BUSY, f"{load}; no engine progress for {stalled_for:.1f}s "
                         f"({intervals} of 2 readings); watching", settled=False)


def _trailing(observations: Sequence[Observation], predicate) -> int:
    count = 0
    for observation in reversed(observations):
        if not predicate(observation):
            break
        count += 1
    return count
