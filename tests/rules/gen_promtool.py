"""The truth table, engine two: turn tests/scenarios/*.yaml into ``promtool test rules`` files.

Each scenario step is made into the ``Observation`` the exporter would have made, rendered by
the exporter's own exposition (``observations.exported_samples``): the input series are
what Prometheus would have stored (a value per scrape, ``stale`` where a series disappears, as
Prometheus marks it, ``up`` for every scrape of the exporter).

Every scenario runs in several **variants**: the state is checked at 0.5, 3, 7 and 14 s after
each reading (of a 15 s scrape; scaled with the scrape interval), with the readings on the
scrape schedule and again jittered by up to 0.3 s. promtool evaluates rules only at multiples
of ``evaluation_interval`` (the groups' interval, a fifth of a scrape), so the *readings* are
moved instead: input series have a fine ``interval`` (a 150th of a scrape: 100 ms at 15 s) and
each reading sits where the variant puts it, ``_`` elsewhere. The alerts of a step are checked
at the first evaluation after its reading, the scenario's ``alert_checks`` at their times.

Every variant runs against the rules as rendered (Prometheus 2's closed ranges, which is what
promtool 2.42 evaluates); the on-schedule one, where readings fall on evaluations, also runs
against the same rules with every range a millisecond shorter, which is exactly Prometheus 3's
left-open range for millisecond timestamps (jittered readings never sit on an edge).

The expectations are independent of the rules under test: the state from the scenario, the
alert labels from DESIGN.md (target labels kept, ``action="restart"`` only on the hang alert)
and the severities from docs/runbook.md. Alerts are checked as the ``ALERTS`` series (their
labels); annotations are checked by tests/rules/test_configs.py.

    python -m tests.rules.gen_promtool --out DIR
"""
from __future__ import annotations

import argparse
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from hangwatch.rules.render import Settings, format_duration, write

from .observations import exported_samples, series_name
from .scenarios import ALERTS, EVAL_SHARE, ROOT, STATES, TARGET_LABELS, Scenario, load_all
from .served import served

STATE_RECORD = "target:hangwatch_backend_state:current"
RULE_NAMES = ("hangwatch-recording.yml", "hangwatch-alerts.yml")
GROUP_ORDER = ["hangwatch-recording", "hangwatch-alerts"]
OFFSETS = (0.5, 3.0, 7.0, 14.0)   # seconds after a reading, at a 15 s scrape
JITTER = 0.3                      # seconds, at a 15 s scrape
RESOLUTION = 150                  # input samples per scrape interval (100 ms at 15 s)
SEMANTICS = ("closed", "left-open")


@dataclass(frozen=True)
class Variant:
    offset: float          # seconds after each reading (at 15 s) at which the state is checked
    jitter: bool

    @property
    def name(self) -> str:
        return f"+{self.offset:g}s" + (" jittered" if self.jitter else "")


# On the schedule, a reading's timestamp falls on an evaluation (+3 s): the one place where a
# range edge could meet a reading, so the one variant run under both range semantics.
BASELINE = (Variant(3.0, False),)
VARIANTS = BASELINE + tuple(Variant(offset, True) for offset in OFFSETS)
PER_SEMANTICS = {"closed": VARIANTS, "left-open": BASELINE}


# --- expectations from outside the rules ----------------------------------------------------

def runbook_severities() -> dict[str, str]:
    """Each alert's severity as docs/runbook.md tells people (``## Name`` then ``**Severity** x``)."""
    found, current = {}, None
    for line in (ROOT / "docs" / "runbook.md").read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        match = re.match(r"\*\*Severity\*\* (\w+)", line)
        if match and current:
            found[current] = match.group(1)
    return found


def expected_alert(name: str, severities: dict[str, str]) -> str:
    """The ALERTS series of a firing alert, as DESIGN.md's seams say it must look."""
    if name == "HangwatchExporterAbsent":
        labels = {}                              # no target exists to name
    else:
        labels = dict(TARGET_LABELS)             # "Every backend alert keeps both" (target, container)
    labels |= {"alertname": name, "alertstate": "firing", "severity": severities[name]}
    if name == "HangwatchBackendHung":
        labels["action"] = "restart"             # the one restart alert
    return series_name("ALERTS", labels)


# --- timing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """Milliseconds: where a variant puts the readings and the checks of one scenario."""

    scrape: int
    variant: Variant

    @property
    def evaluation(self) -> int:
        return round(self.scrape * EVAL_SHARE)

    @property
    def step(self) -> int:
        return self.scrape // RESOLUTION

    @property
    def offset(self) -> int:
        return round(self.variant.offset / 15 * self.scrape)

    @property
    def shift(self) -> int:
        """Readings sit this long after a multiple of the scrape interval (0 < shift <= evaluation),
        so that ``offset`` after a reading is an evaluation."""
        return self.evaluation - self.offset % self.evaluation

    def jitters(self, seed: str, count: int) -> list[int]:
        if not self.variant.jitter:
            return [0] * count
        most = round(JITTER / 15 * self.scrape) // self.step
        late = most if self.offset % self.evaluation >= (most + 1) * self.step else 0
        rng = random.Random(seed)
        return [rng.randint(-most, late) * self.step for _ in range(count)]

    def reading_at(self, index: int, jitter: int) -> int:
        return index * self.scrape + self.shift + jitter

    def state_check(self, index: int) -> int:
        return index * self.scrape + self.shift + self.offset

    def alert_check(self, index: int) -> int:
        """The first evaluation after the reading (jitter never moves a reading past it)."""
        return index * self.scrape + self.evaluation


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _values(points: dict[int, str], last: int) -> str:
    """promtool's series notation for samples at the given input indices (``_xN`` for gaps)."""
    out, blanks = [], 0
    for index in range(last + 1):
        if index in points:
            if blanks:
                out.append("_" if blanks == 1 else f"_x{blanks}")
                blanks = 0
            out.append(points[index])
        else:
            blanks += 1
    return " ".join(out)


def input_series(scenario: Scenario, timing: Timing) -> list[dict]:
    jitters = timing.jitters(f"{scenario.name} {timing.variant.name}", len(scenario.steps))
    factor = timing.scrape / (scenario.scrape_interval * 1000)  # shrunk rules: the target's window shrinks too
    own_window = None if scenario.target_stall_window is None else scenario.target_stall_window * factor
    per_step = []
    for step, jitter, seen in zip(scenario.steps, jitters, served(scenario.name)):
        observation = seen.observation
        samples = exported_samples(observation, scenario.module, TARGET_LABELS, scraped=step.status != "absent",
                                   stall_window=own_window)
        per_step.append((timing.reading_at(step.index, jitter) // timing.step, samples))
    names = sorted({name for _, samples in per_step for name in samples})
    last = max(index for index, _ in per_step)
    series = []
    for name in names:
        points, present = {}, False
        for index, samples in per_step:
            if name in samples:
                points[index] = _number(samples[name])
                present = True
            elif present:
                points[index] = "stale"
                present = False
        series.append({"series": name, "values": _values(points, last)})
    return series


def _at(millis: int) -> str:
    return format_duration(millis / 1000) if millis else "0s"


def test_group(scenario: Scenario, timing: Timing, severities: dict[str, str]) -> dict:
    expr_tests = []
    previous = None
    for step in scenario.steps:
        states = [] if step.expect_promql == "none" else [
            {"labels": series_name(STATE_RECORD, {**TARGET_LABELS, "state": state}),
             "value": 1 if state == step.expect_promql else 0} for state in STATES]
        expr_tests.append({"expr": STATE_RECORD, "eval_time": _at(timing.state_check(step.index)),
                           "exp_samples": states})
        expr_tests.append(_alerts_at(timing.alert_check(step.index), step.alerts + kept_firing(previous, step),
                                     severities))
        previous = step
    factor = timing.scrape / (scenario.scrape_interval * 1000)
    for seconds, names in scenario.alert_checks:
        expr_tests.append(_alerts_at(round(seconds * 1000 * factor), names, severities))
    return {"name": f"{scenario.name} {timing.variant.name}", "interval": _at(timing.step),
            "input_series": input_series(scenario, timing), "promql_expr_test": expr_tests}


def kept_firing(previous, step) -> tuple[str, ...]:
    """The restart alert keeps firing half a scrape after the state leaves hung (it reads the
    state over the last half scrape: a window reaching back to a reading from before a freeze for a moment
    must not resolve it and notify twice): at the first evaluation after the first reading that
    is no longer hung it still fires. The scenarios' ``alert_checks`` show it resolved later."""
    if previous is not None and "HangwatchBackendHung" in previous.alerts \
            and "HangwatchBackendHung" not in step.alerts and step.expect_promql != "none":
        return ("HangwatchBackendHung",)
    return ()


def _alerts_at(millis: int, names, severities) -> dict:
    assert set(names) <= set(ALERTS), names
    return {"expr": 'ALERTS{alertstate="firing"}', "eval_time": _at(millis),
            "exp_samples": [{"labels": expected_alert(name, severities), "value": 1} for name in sorted(names)]}


def promtool_test(scenario: Scenario, rule_files: list[Path], variants=VARIANTS, scale: float = 1.0) -> dict:
    """One ``promtool test rules`` document: ``scenario`` in each variant (times scaled by ``scale``)."""
    scrape = round(scenario.scrape_interval * scale * 1000)
    assert scrape % RESOLUTION == 0 and scrape % 5 == 0, scrape
    severities = runbook_severities()
    return {
        "rule_files": [str(path) for path in rule_files],
        "evaluation_interval": _at(round(scrape * EVAL_SHARE)),
        # promtool otherwise evaluates the groups in random order; recording first mirrors
        # the worst case being no worse than a real Prometheus, where the alert group may
        # lag the recording group by up to one interval (counted in the latency budget).
        "group_eval_order": GROUP_ORDER,
        "tests": [test_group(scenario, Timing(scrape, variant), severities) for variant in variants],
    }


# --- the rules under test -------------------------------------------------------------------

def left_open(text: str) -> str:
    """A rule file whose every range is 1 ms shorter: closed [t-d+1ms, t] = left-open (t-d, t]."""
    def shorter(match: re.Match) -> str:
        millis = round(float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)] * 1000)
        return f"[{millis - 1}ms]"
    data = yaml.safe_load(text)
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[(\d+)(ms|s|m|h)\]", shorter, rule["expr"])
    return yaml.safe_dump(data, sort_keys=False, width=200)


def rule_files(out: Path, settings: Settings, semantics: str = "closed") -> list[Path]:
    """The recording and alert rules as ``hangwatch rules`` writes them for ``settings``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = write(out, settings, RULE_NAMES)
    if semantics == "left-open":
        for path in paths:
            path.write_text(left_open(path.read_text()))
    return paths


def stall_windows(scenario: Scenario) -> tuple[tuple[str, float], ...]:
    """The scenario's ``stall_window`` as ``hangwatch rules --stall-window`` would set it (for every engine)."""
    return () if scenario.stall_window is None else (("*", scenario.stall_window),)


def write_all(out: Path, scale: float = 1.0, variants=VARIANTS, names=None) -> list[Path]:
    """One test file per scenario (those ``names``, or all) and range semantics, against the
    rules for its scrape interval."""
    written = []
    for scenario in load_all():
        if names is not None and scenario.name not in names:
            continue
        interval = scenario.scrape_interval * scale
        for semantics in SEMANTICS:
            windows = stall_windows(scenario)
            rules = rule_files(out / f"rules-{format_duration(interval)}-{semantics}-{len(windows) and windows[0][1]:g}",
                               Settings(scrape_interval=interval, wall_clock_scale=scale, stall_windows=windows),
                               semantics)
            path = out / f"{scenario.name}.{semantics}.test.yml"
            chosen = [v for v in variants if v in PER_SEMANTICS[semantics]]
            if not chosen:
                continue
            path.write_text(yaml.safe_dump(promtool_test(scenario, rules, chosen, scale), sort_keys=False,
                                           width=200))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
