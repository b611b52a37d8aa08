"""The truth table as data: load tests/scenarios/*.yaml, the one source for both engines.

A scenario is a backend's readings over time, one step per scrape (15 s apart unless the
scenario sets ``scrape_interval``), with the verdict expected after each step and the alerts
expected to be firing. ``test_truth_table_python`` feeds the steps to ``hangwatch.verdict.judge``;
``gen_promtool`` turns the same steps into ``promtool test rules`` files.

Step fields (see tests/scenarios/README.md for the full format):

- ``status``: ``ok`` (default), ``blind`` (HTTP answered, /metrics unusable), ``refused``,
  ``timeout`` (connection accepted, no answer: the stalled case), ``gap`` (Prometheus failed
  to scrape the exporter: no reading at all) or ``absent`` (no hangwatch target exists).
- reading fields, carried over from the previous step unless given (``null`` = the engine
  does not provide it): ``running``, ``waiting``, ``steps``, ``prompt``, ``gen``,
  ``prefix``, ``finished``, ``kv``, ``start``, ``asleep``, ``deferred`` (the waiting
  requests the engine defers; ``null``, the default, = the engine does not say), ``served``
  (requests answered, not aborted), ``preempted`` (preemptions), ``decodes`` (TGI's decode
  calls); those three ``null`` by default.
- ``stall_window`` (scenario): the rules' window for every engine, as ``hangwatch rules
  --stall-window``; ``target_stall_window``: the target's own, as the exporter config's.
- ``probe``: ``ok`` / ``fail`` / ``rejected`` (a 4xx): how the served engine answers the idle
  probe (``ok`` when not given), and — when given — that production's observer must send one
  at this step (tests/rules/served.py sees it arrive at the server).
- ``expect``: the verdict of both engines after this step (``none`` for gap/absent steps).
  ``expect_promql`` (with ``why``) where the PromQL state necessarily differs in timing.
- ``alerts``: the alert names firing at this step's evaluation time (default none).
- ``repeat``: the step repeated N times.

Time mapping: step i is the reading scraped at ``i * S`` (S the scrape interval); its alerts
are checked at ``i * S + S/5`` (the rules run every fifth of a scrape: the first evaluation
after the reading), its PromQL state there and at other instants before the next reading
(gen_promtool's offsets). ``alert_checks`` add checks at other instants (the ``for:``
boundaries), in seconds from step 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = ROOT / "tests" / "scenarios"
RULE_FILES = (ROOT / "rules" / "hangwatch-recording.yml", ROOT / "rules" / "hangwatch-alerts.yml")

SCRAPE_INTERVAL = 15.0   # seconds between steps unless a scenario sets scrape_interval
# The truth table's assumption about the rules: they are evaluated every fifth of a scrape
# (tests/rules/test_configs.py checks the rendered groups against it).
EVAL_SHARE = 0.2

STATES = ("idle", "busy", "hung", "stalled", "restarted", "blind", "down")
STATUSES = ("ok", "blind", "refused", "timeout", "gap", "absent")
READING_FIELDS = ("running", "waiting", "steps", "prompt", "gen", "prefix", "finished", "kv", "start", "asleep",
                  "deferred", "served", "preempted", "decodes")
ALERTS = ("HangwatchBackendHung", "HangwatchBackendDown", "HangwatchBackendBlind",
          "HangwatchBackendRestarted", "HangwatchExporterDown", "HangwatchExporterAbsent",
          "HangwatchProbeRejected", "HangwatchRequestsDeferred", "HangwatchBackendStalled",
          "HangwatchBackendThrashing")
PROBE_ENDINGS = {"ok": "answered", "fail": "failed", "rejected": "rejected"}
STEP_KEYS = set(READING_FIELDS) | {"status", "probe", "expect", "expect_promql", "why", "alerts", "repeat", "note"}
SCENARIO_KEYS = {"name", "description", "module", "engine", "grace", "steps", "alert_checks", "scrape_interval",
                 "stall_window", "target_stall_window"}
TARGET_LABELS = {"job": "hangwatch", "instance": "http://127.0.0.1:8000", "target": "vllm-a", "container": "vllm-a"}


@dataclass(frozen=True)
class Step:
    index: int
    status: str
    values: dict            # reading fields (None = not provided by the engine)
    declared_probe: str | None  # the step's ``probe:`` (ok | fail | rejected): how a probe is answered,
                                # and that one must reach the server; None: answered ok, if one comes
    expect: str             # a verdict, or "none"
    expect_promql: str
    why: str
    alerts: tuple[str, ...]
    scrape: float = SCRAPE_INTERVAL

    @property
    def scraped(self) -> bool:
        return self.status not in ("gap", "absent")

    @property
    def in_flight(self) -> float:
        return (self.values.get("running") or 0) + (self.values.get("waiting") or 0)

    @property
    def schedulable(self) -> float:
        return self.in_flight - min(self.values.get("deferred") or 0, self.values.get("waiting") or 0)

    @property
    def time(self) -> float:
        return self.index * self.scrape

    @property
    def eval_time(self) -> float:
        return self.time + self.scrape * EVAL_SHARE


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    module: str
    grace: float
    engine: str
    steps: tuple[Step, ...]
    alert_checks: tuple[tuple[float, tuple[str, ...]], ...] = field(default=())
    path: Path | None = None
    scrape_interval: float = SCRAPE_INTERVAL
    stall_window: float | None = None         # the rules' window for every engine (None: each engine's own)
    target_stall_window: float | None = None  # the target's own (exporter config): hangwatch_stall_window_seconds

    def window(self) -> float:
        """The stall window both engines judge this scenario's backend by."""
        from hangwatch.engines import ENGINES_BY_NAME
        if self.target_stall_window is not None:
            return self.target_stall_window
        return self.stall_window if self.stall_window is not None else ENGINES_BY_NAME[self.engine].stall_window


class ScenarioError(ValueError):
    pass


def _seconds(value) -> float:
    text = str(value)
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("m"):
        return float(text[:-1]) * 60
    if text.endswith("s"):
        text = text[:-1]
    return float(text)


def load(path: Path) -> Scenario:
    data = yaml.safe_load(path.read_text())
    where = path.name
    unknown = set(data) - SCENARIO_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    module = data.get("module", "backend")
    scrape = _seconds(data.get("scrape_interval", SCRAPE_INTERVAL))
    values: dict = {"running": 0, "waiting": 0, "asleep": 0, "deferred": None, "served": None, "preempted": None,
                    "decodes": None}
    steps: list[Step] = []
    for n, raw in enumerate(data["steps"]):
        at = f"{where}: steps[{n}]"
        unknown = set(raw) - STEP_KEYS
        if unknown:
            raise ScenarioError(f"{at}: unknown key {sorted(unknown)[0]!r}")
        status = raw.get("status", "ok")
        if status not in STATUSES:
            raise ScenarioError(f"{at}.status: {status!r} not one of {STATUSES}")
        for name in READING_FIELDS:
            if name in raw:
                values[name] = raw[name]
        expect = raw.get("expect")
        if expect is None:
            raise ScenarioError(f"{at}.expect: required")
        if (expect == "none") == (status in ("ok", "blind", "refused", "timeout")):
            raise ScenarioError(f"{at}.expect: 'none' exactly for gap/absent steps")
        if expect != "none" and expect not in STATES:
            raise ScenarioError(f"{at}.expect: {expect!r} not a verdict")
        expect_promql = raw.get("expect_promql", expect)
        if expect_promql != expect and not raw.get("why"):
            raise ScenarioError(f"{at}.why: required when expect_promql differs from expect")
        alerts = tuple(raw.get("alerts", ()))
        for alert in alerts:
            if alert not in ALERTS:
                raise ScenarioError(f"{at}.alerts: unknown alert {alert!r}")
        if "HangwatchBackendHung" in alerts and not expect == expect_promql == "hung":
            raise ScenarioError(f"{at}.alerts: the restart alert fires only where both verdicts are hung")
        probe_field = raw.get("probe")
        if probe_field is not None and probe_field not in PROBE_ENDINGS:
            raise ScenarioError(f"{at}.probe: {probe_field!r} not one of {sorted(PROBE_ENDINGS)}")
        # Whether a probe goes out is not decided here: tests/rules/served.py observes each step
        # through production's observer and sees the probe arrive (or not) at the server.
        for _ in range(int(raw.get("repeat", 1))):
            steps.append(Step(len(steps), status, dict(values), probe_field, expect, expect_promql,
                              raw.get("why", ""), alerts, scrape))
    checks = tuple((_seconds(c["at"]), tuple(c.get("alerts", ()))) for c in data.get("alert_checks", ()))
    windows = {key: _seconds(data[key]) if key in data else None for key in ("stall_window", "target_stall_window")}
    return Scenario(data["name"], data.get("description", ""), module, float(data.get("grace", 0)),
                    data.get("engine", "vllm"), tuple(steps), checks, path, scrape, **windows)


def load_all() -> list[Scenario]:
    scenarios = [load(path) for path in sorted(SCENARIO_DIR.glob("*.yaml"))]
    if not scenarios:
        raise ScenarioError(f"no scenarios in {SCENARIO_DIR}")
    return scenarios
