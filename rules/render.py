"""Render hangwatch's Prometheus rules for one Prometheus: its scrape interval, job names, runbook.

The rules are written once, as templates (``templates/*.yml``) whose durations say what they
mean instead of how long they are at 15 s:

- ``${scrapes:X}``: X scrape intervals (a group's ``interval:`` and the hang alert's ``for:``
  are a fifth of a scrape); scales with the scrape interval;
- ``${scrape_seconds:X}``: X scrape intervals as a number of seconds (for series holding seconds);
- ``${wall:10m}``: wall-clock (weights load for minutes whatever the scrape interval);
- ``${range}`` in a rule with ``readings: N``: a range holding the last N readings (exactly
  N on schedule, more only when a scrape came more than half an interval late; see
  ``readings_expr``); there ``${scrapes_in_range}`` (up's count over the range) and
  ``${readings}`` (N) let a rule keep only ranges holding N scrapes itself;
  ``${streak}``: two readings plus the longest scrape timeout;
- ``${progress}`` and ``${resets}`` in a rule with ``readings: N``: the engine's progress signals
  changing, its counters going backwards, one series per target each (``progress_expr``,
  ``resets_expr``);
- ``- generate: engine_grace``: the per-engine minimum grace rule, built from
  ``hangwatch/engines.py`` (``min_grace``, wall-clock);
- ``- generate: stall_window``: each backend's stall window in seconds: the target's own
  (``hangwatch_stall_window_seconds``, from the exporter config), else its engine's
  (``stall_window`` in ``hangwatch/engines.py``, or ``--stall-window``; wall-clock);
- ``${job}``, ``${own_jobs}`` (the exporter's and the webhook's own jobs), ``${job_name}``: the Prometheus jobs (user settings);
  ``${runbook:anchor}``: a link into the runbook (a user setting, absolute by default).

Templates are read and the rules written with a YAML library: a template is data, a rendered
file is that data with every placeholder resolved, plus comments (a rule's template-only
``comment:``) and a header naming the settings. ``hangwatch rules`` writes them for users;
the files in ``rules/*.yml`` are this module's output for the defaults (a test keeps them
fresh), which the compose stack and deploy/kubernetes load.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

import yaml

from hangwatch.engines import ENGINES, EngineMetrics
from hangwatch.settings import ConfigError, duration

RUNBOOK_URL = "https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md"
DEFAULT_SCRAPE = 15.0
TEMPLATES = ("hangwatch-recording.yml", "hangwatch-alerts.yml", "hangwatch-fleet.yml")
# The longest scrape_timeout the rules allow, as a share of the scrape interval (docs/runbook.md#tuning).
MAX_TIMEOUT_SHARE = 2 / 3
# Where a window's edge sits between two readings, as a share of the scrape interval: half-way,
# as far as can be from every reading (see the header below).
EDGE = 0.5

_PLACEHOLDER = re.compile(r"\$\{(\w+)(?::([^}]*))?\}")


@dataclass(frozen=True)
class Settings:
    """What differs between one Prometheus and another."""

    scrape_interval: float = DEFAULT_SCRAPE   # seconds: the hangwatch job's scrape_interval
    job: str = "hangwatch"                    # the job scraping /probe (a regex, fully anchored)
    exporter_job: str = "hangwatch_exporter"  # the job scraping the exporter's own /metrics
    webhook_job: str = "hangwatch_webhook"    # the job scraping the webhook's own /metrics
    runbook_url: str = RUNBOOK_URL            # the runbook; alerts link to its sections
    # Tests and demos only: shrink wall-clock durations (minutes, engine grace) too.
    wall_clock_scale: float = 1.0
    engines: tuple[EngineMetrics, ...] = ENGINES
    # --stall-window: (engine name or "*" for every engine, seconds), later entries winning.
    stall_windows: tuple[tuple[str, float], ...] = ()

    def stall_window(self, engine: EngineMetrics) -> float:
        """The engine's stall window for these rules, in seconds (before ``wall_clock_scale``)."""
        window = engine.stall_window
        for name, seconds in self.stall_windows:
            if name in ("*", engine.name):
                window = seconds
        return window

    def __post_init__(self):
        if not self.scrape_interval >= 0.1:
            raise ConfigError(f"--scrape-interval: {self.scrape_interval:g}s is shorter than 100ms")
        if not re.fullmatch(r"https?://\S+", self.runbook_url):
            raise ConfigError(f"--runbook-url: {self.runbook_url!r} is not an http(s) URL")
        for flag, value in (("--job", self.job), ("--exporter-job", self.exporter_job),
                            ("--webhook-job", self.webhook_job)):
            if not value or '"' in value or "\\" in value or "\n" in value:
                raise ConfigError(f"{flag}: {value!r} is not a job name")
        known = {engine.name for engine in self.engines}
        for name, seconds in self.stall_windows:
            if name != "*" and name not in known:
                raise ConfigError(f"--stall-window: unknown engine {name!r} (one of {', '.join(sorted(known))})")
            if not seconds >= self.scrape_interval * 2:
                raise ConfigError(f"--stall-window: {seconds:g}s is shorter than two scrape intervals")


def parse_interval(text: str, flag: str = "--scrape-interval") -> float:
    return duration(text, flag, low=0.1, high=3600.0)


def format_duration(seconds: float) -> str:
    """A Prometheus duration, exact to the millisecond: ``45s``, ``10m``, ``37500ms``."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"duration {seconds}s rounds to zero")
    if millis % 60000 == 0:
        return f"{millis // 60000}m"
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"


# --- windows --------------------------------------------------------------------------------

def readings_windows(readings: int, scrape: float) -> tuple[float, ...]:
    """The ranges which between them hold the last ``readings`` readings at every instant.

    Readings come one scrape apart. A range of (N - 1/2) scrapes holds exactly N of them in the
    first half of each scrape interval (after the newest reading is stored) and N - 1 in the
    second; a range of (N + 1/2) scrapes holds N + 1, then N — and N while the newest scrape is
    still running (Prometheus stores a reading when its scrape ends, up to scrape_timeout after
    its timestamp). The short range is used where ``up`` (one sample per scrape, failed ones
    included) shows it holds at least N scrapes, else the long one where it does: on schedule
    that is exactly N. Both edges sit half a scrape from every reading, so closed (Prometheus 2)
    and left-open (Prometheus 3) ranges agree, and scrape jitter, the rule evaluation's phase and
    the scrape's duration move no reading across an edge.

    A scrape more than half an interval late leaves both ranges short of N readings until it
    comes, and with the next one on time puts two readings in one half interval, so that a range
    holds N + 1 for a while. Asking for exactly N found no range then, for an evaluation or two:
    a frozen server read busy in between and its hang alert fired twice (measured in CI: a 3 s
    job scraped 1.9 s late under load). So a range is used where it holds at least N readings,
    and decisions over three readings or more (the ones a hang rests on) have a third range,
    N + 3/2 scrapes, used only where neither of the others holds N: while a scrape is up to one
    and a half intervals late. On schedule the third range is never used. Where a range holds
    more than N, a decision reads the last N readings and older ones, and each is the cautious
    one: progress in any, a restart in any, a reading missing or not in flight in any keeps a
    target from hung. Two-reading decisions (a restart) go without the third range: their
    counters are the costliest to read, and a hang over the same readings is kept from hung by
    the three-reading start-time check anyway.
    """
    windows = ((readings - 1 + EDGE) * scrape, (readings + EDGE) * scrape)
    if readings >= 3:
        windows += ((readings + 1 + EDGE) * scrape,)
    return windows


def readings_for(grace: float, scrape: float) -> int:
    """Readings needed to span ``grace`` seconds: hangwatch/verdict.py asks stalled_for >= grace."""
    return max(3, math.ceil(grace / scrape - 1e-9) + 1)


def readings_expr(expr: str, readings: int, settings: Settings) -> str:
    """``expr`` (ranges written ``${range}``) over the last ``readings`` readings (see ``readings_windows``).

    Each range's branch is kept where ``up`` shows it holds at least N scrapes. An expression
    that reads that count itself (``${scrapes_in_range}``, with ``${readings}`` for N) keeps
    only such ranges itself and is not wrapped: one range read of ``up`` less per range."""
    parts = []
    def scrapes(range_text: str) -> str:
        return f"count_over_time(up{{{job_matcher(settings)}}}[{range_text}])"

    for window in readings_windows(readings, settings.scrape_interval):
        text = format_duration(window)
        filled = (expr.strip().replace("${range}", text).replace("${scrapes_in_range}", scrapes(text))
                  .replace("${readings}", str(readings)))
        body = "\n".join("    " + line for line in filled.splitlines())
        if "${scrapes_in_range}" in expr:
            parts.append(f"(\n{body}\n)")
        else:
            parts.append(f"(\n{body}\n)\n  and on (job, instance) {scrapes(text)} >= {readings}")
    return "\n or\n".join(parts) + "\n"


PROGRESS_FINGERPRINT = "hangwatch_engine_progress_fingerprint"


def progress_expr(range_text: str = "${range}") -> str:
    """Engine work over a range: the number of times the exporter's progress fingerprint changed.

    The fingerprint (``hangwatch.verdict.progress_fingerprint``) changes whenever one of the
    engine's progress signals does, so this is one ``changes()`` over one series per target.
    Reading every signal instead (a union of each signal's ``changes()``, as these rules did
    before) was the costliest part of the recording group at fleet scale: 79 ms per expression at
    1,000 targets on Prometheus 2.42, of which 59 ms was reading the six series.
    tests/rules/test_signal_union.py checks that both find the same work."""
    return f"changes({PROGRESS_FINGERPRINT}[{range_text}])\n"


COUNTERS_SUM = "hangwatch_engine_counters_total"


def resets_expr(range_text: str = "${range}") -> str:
    """A new process over a range, where the engine gives no start time: its counters going back.

    One ``resets()`` of the sum of the counters (``hangwatch.verdict.counters_sum``), not one
    per counter: reading every counter over both ranges was the costliest rule of the group.
    tests/rules/test_signal_union.py checks that it sees the restarts the per-counter chain sees."""
    return f"resets({COUNTERS_SUM}[{range_text}])\n"


PROGRESS_3 = "target:hangwatch_engine_progress:changes_3scrapes"  # recorded before the grace rule


def grace_rule(settings: Settings) -> dict:
    """1 for a backend whose engine's minimum grace (hangwatch/engines.py) is not over yet.

    One branch per distinct number of readings the graces span, not per engine: the progress
    expression is the costly part of the group (five ``changes()`` over every target, twice),
    so engines spanning the same readings share one, and a grace spanning three readings reads
    the 3-reading progress recorded just before it in the same group (rules of a group run in
    order at one evaluation time, and a later rule sees what an earlier one recorded)."""
    slow = [engine for engine in settings.engines if engine.min_grace > 0]
    by_readings: dict[int, list[str]] = {}
    for engine in slow:
        readings = readings_for(engine.min_grace * settings.wall_clock_scale, settings.scrape_interval)
        by_readings.setdefault(readings, []).append(engine.name)
    branches = []
    for readings, names in sorted(by_readings.items()):
        engines = names[0] if len(names) == 1 else "|".join(names)
        matcher = f'engine="{engines}"' if len(names) == 1 else f'engine=~"{engines}"'
        if readings == 3:
            flat = PROGRESS_3
        else:
            flat = readings_expr(progress_expr(), readings, settings)
        indented = "\n".join("        " + line for line in flat.rstrip().splitlines())
        branches.append(f"    hangwatch_backend_info{{{matcher}}}\n"
                        f"  unless on (job, instance) (\n{indented}\n  ) == 0")
    if not branches:
        expr = "vector(1) unless vector(1)\n"
    else:
        expr = ("group without (engine, module, models, version) (\n"
                + "\n or\n".join(f"  (\n{b}\n  )" for b in branches) + "\n)\n")
    names = ", ".join(f"{e.name} {format_duration(e.min_grace * settings.wall_clock_scale)}" for e in slow)
    return {
        "comment": (f"Generated from hangwatch/engines.py (min_grace: {names}). One step of these engines can "
                    "take longer than two scrapes (one llama.cpp prompt batch moves nothing for seconds), so "
                    "no progress must also hold for the engine's minimum grace, as in hangwatch/verdict.py: "
                    "1 while the readings spanning it (grace / scrape interval + 1, at least 3) are not all "
                    "without progress. Wall-clock: at a shorter scrape it spans more readings. Engines whose "
                    "graces span the same readings share one branch (the progress expression is the costly "
                    "part of this group); three readings reuse the 3-reading progress recorded above."),
        "record": "target:hangwatch_engine_progress:within_grace",
        "expr": expr,
    }


def stall_window_rule(settings: Settings) -> dict:
    """Each backend's stall window in seconds: its own (``hangwatch_stall_window_seconds``, set
    by the exporter config's ``stall_window``), else its engine's. One branch per distinct
    window, not per engine. Values, not ranges: the stall rules compare a duration held in a
    series (``target:hangwatch_engine_output:flat_seconds``) with it, so a window per target
    costs nothing more than one per engine."""
    by_window: dict[float, list[str]] = {}
    for engine in settings.engines:
        if engine.output:
            seconds = round(settings.stall_window(engine) * settings.wall_clock_scale, 3)
            by_window.setdefault(seconds, []).append(engine.name)
    branches = ["hangwatch_stall_window_seconds"]
    for seconds, names in sorted(by_window.items()):
        matcher = f'engine="{names[0]}"' if len(names) == 1 else f'engine=~"{"|".join(names)}"'
        branches.append(f"group without (engine, module, models, version) (hangwatch_backend_info{{{matcher}}})"
                        f" * {seconds:g}")
    windows = ", ".join(f"{'/'.join(names)} {format_duration(seconds)}" for seconds, names in sorted(by_window.items()))
    return {
        "comment": (f"Generated from hangwatch/engines.py (stall_window: {windows}; `hangwatch rules --stall-window` "
                    "sets them). The window is longer than any legitimate request goes without output on "
                    "the engine's hardware (a long prefill; for engines counting output only when a request "
                    "finishes, a whole request). A target's own stall_window (exporter config) wins. "
                    "Wall-clock: it does not scale with the scrape interval."),
        "record": "target:hangwatch_stall_window:seconds",
        "expr": "\nor\n".join(branches) + "\n",
    }


# --- placeholders ---------------------------------------------------------------------------

def job_matcher(settings: Settings) -> str:
    return f'job=~"{settings.job}"'


def _fill(text: str, settings: Settings, where: str) -> str:
    def one(match: re.Match) -> str:
        name, arg = match.group(1), match.group(2)
        if name == "scrapes":
            return format_duration(float(arg) * settings.scrape_interval)
        if name == "scrape_seconds":  # a number, for arithmetic on durations held in series
            return f"{float(arg) * settings.scrape_interval:g}"
        if name == "wall":
            return format_duration(duration(arg, where) * settings.wall_clock_scale)
        if name == "streak":
            return format_duration((2 + MAX_TIMEOUT_SHARE) * settings.scrape_interval)
        if name == "job":
            return job_matcher(settings)
        if name == "job_name":
            return settings.job
        if name == "own_jobs":  # every job scraping hangwatch itself: the exporter's and the webhook's
            return f'job=~"{settings.job}|{settings.exporter_job}|{settings.webhook_job}"'
        if name == "runbook":
            return f"{settings.runbook_url}#{arg}"
        raise ValueError(f"{where}: unknown placeholder {match.group(0)}")
    return _PLACEHOLDER.sub(one, text)


def _render_rule(rule: dict, settings: Settings, where: str) -> dict:
    rule = dict(rule)
    if "expr" in rule:
        rule["expr"] = rule["expr"].replace("${progress}", progress_expr()).replace("${resets}", resets_expr())
    readings = rule.pop("readings", None)
    if readings is not None:
        rule["expr"] = readings_expr(rule["expr"], int(readings), settings)
    elif "${range}" in rule.get("expr", ""):
        raise ValueError(f"{where}: ${{range}} needs readings: N")
    return _resolve(rule, settings, where)


def _resolve(value, settings: Settings, where: str):
    if isinstance(value, str):
        return _fill(value, settings, where)
    if isinstance(value, dict):
        return {key: _resolve(item, settings, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, settings, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


def template_text(name: str) -> str:
    return resources.files("hangwatch.rules").joinpath("templates", name).read_text()


def template(name: str) -> dict:
    return yaml.safe_load(template_text(name))


def description(name: str) -> str:
    """The template's own header comment, after its first line (which says it is a template)."""
    lines = []
    for line in template_text(name).splitlines()[1:]:
        if not line.startswith("#"):
            break
        if lines or line.strip("# "):
            lines.append(line)
    return "".join(line + "\n" for line in lines)


def rule_groups(name: str, settings: Settings) -> list[dict]:
    """The groups of one rule file, every placeholder resolved (rules keep their ``comment``)."""
    groups = []
    for group in template(name)["groups"]:
        rules = []
        for i, rule in enumerate(group["rules"]):
            where = f"{name}: {group['name']}.rules[{i}]"
            if rule.get("generate") == "engine_grace":
                rule = grace_rule(settings)
            elif rule.get("generate") == "stall_window":
                rule = stall_window_rule(settings)
            rules.append(_render_rule(rule, settings, where))
        groups.append({**_resolve({k: v for k, v in group.items() if k != "rules"}, settings, name),
                       "rules": rules})
    return groups


# --- writing --------------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL), so the files read like hand-written ones."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def _dump(data, indent: str) -> str:
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100,
                     allow_unicode=True)
    return "".join(indent + line if line.strip() else line for line in text.splitlines(keepends=True))


def _comment(text: str, indent: str) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(indent) + 2 + len(line) + 1 + len(word) > 100:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return "".join(f"{indent}# {line}\n" for line in lines)


def header(name: str, settings: Settings) -> str:
    s = settings.scrape_interval
    lo, hi, late = readings_windows(3, s)
    lines = [
        f"GENERATED by `hangwatch rules` from templates/{name}; do not edit. Settings: scrape interval "
        f"{format_duration(s)}, job=~\"{settings.job}\", exporter job=~\"{settings.exporter_job}\", "
        f"runbook {settings.runbook_url}"
        + ("" if settings.wall_clock_scale == 1 else f", wall-clock durations x{settings.wall_clock_scale:g} (tests)")
        + ". For another Prometheus: hangwatch rules --scrape-interval 5s --job JOB --out DIR "
          "(docs/runbook.md#tuning).",
        "",
        "Durations. Scrape-relative ones scale with the scrape interval: the groups run every fifth of a scrape "
        f"({format_duration(s / 5)}), the hang alert's for: is one such evaluation. Wall-clock ones do not: the "
        "minutes of the alerts for people, and each engine's minimum grace (target:hangwatch_engine_progress:"
        "within_grace, from hangwatch/engines.py).",
        "",
        "Windows hold readings, not seconds. A decision over the last N readings (three for no progress, two "
        "for a restart) reads two ranges: N - 1/2 scrapes and N + 1/2 scrapes "
        f"({format_duration(lo)} and {format_duration(hi)} for three): the short one where up{{job}} - one "
        "sample per scrape, failed ones included - shows it holds at least N scrapes, else the long one where "
        f"it does (and for three readings or more, else N + 3/2 scrapes, {format_duration(late)} for three: "
        "see below). In the first half of a "
        "scrape interval the short range holds the last N readings, in the second half the long one does, "
        "and while a scrape is still running (Prometheus stores a reading when its scrape ends) the long one "
        "holds the N before it. Every range edge thus sits half a scrape interval from every reading: "
        "Prometheus 2 (closed ranges) and 3 (left-open ranges) count the same readings, and neither scrape "
        "jitter, the phase of the rule evaluation nor a scrape lasting up to half the interval moves a reading "
        "across an edge. A range of exactly N scrapes would not: it holds N + 1 readings on Prometheus 2 when "
        "an evaluation falls on a scrape's timestamp, and N - 1 while a scrape is running. A scrape more than "
        "half an interval late (a loaded Prometheus) leaves the two ranges short of N readings until it comes "
        "(the third range holds them, up to one and a half intervals late), and with the next one on time puts "
        "N + 1 readings in a range for a while: a decision then reads older readings too, and stays the "
        "cautious one (work, a restart or a gap in any of them keeps a target from hung) instead of "
        "vanishing. After a failed scrape no range holds N good readings until N more scrapes succeed.",
        "",
        "Twice-in-a-row streaks (a failed idle probe, a stalled connection) read two scrapes plus the longest "
        f"scrape_timeout allowed (two thirds of the interval): {format_duration((2 + MAX_TIMEOUT_SHARE) * s)}; "
        "they hold the last two or three readings and are built to give the same answer for either.",
    ]
    out = [description(name), "#\n"]
    for line in lines:
        out.append(_comment(line, "") if line else "#\n")
    return "".join(out)


def render_file(name: str, settings: Settings = Settings()) -> str:
    """One rule file as text: header, then each group and rule (with its comment) as YAML."""
    out = [header(name, settings), "groups:\n"]
    for group in rule_groups(name, settings):
        rules = group.pop("rules")
        out.append(_dump([group], "  ").rstrip("\n") + "\n    rules:\n")
        for rule in rules:
            comment = rule.pop("comment", None)
            if comment:
                out.append(_comment(comment, "      "))
            out.append(_dump([rule], "      "))
    return "".join(out)


def render_all(settings: Settings = Settings()) -> dict[str, str]:
    return {name: render_file(name, settings) for name in TEMPLATES}


def write(out: Path, settings: Settings = Settings(), names: Iterable[str] = TEMPLATES) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = out / name
        path.write_text(render_file(name, settings))
        written.append(path)
    return written



def shrunk(scrape_interval: float) -> Settings:
    """Tests and demos: the rules for ``scrape_interval`` with every duration, wall-clock ones too,
    scaled as the scrape interval is from 15 s (a 10-minute alert waits 40 s at a 1 s scrape)."""
    return Settings(scrape_interval=scrape_interval, wall_clock_scale=scrape_interval / DEFAULT_SCRAPE)
