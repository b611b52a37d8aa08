"""Render hangwatch's Prometheus rules for one Prometheus: its scrape interval, job names, runbook.

The rules are written once, as templates (``templates/*.yml``; their placeholders are in
``templates/README.md``) whose durations say what they mean instead of how long they are at 15 s,
and read and written with a YAML library, so a rendered file is that data with every placeholder
resolved. ``hangwatch rules`` writes them for users; ``rules/*.yml`` are the defaults' output (a
test keeps them fresh), which the compose stack and deploy/kubernetes load.
"""
from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Iterable

import yaml

from hangwatch.settings import duration

from .engine_rules import grace_rule, stall_window_rule
from .gpu_rules import fault_alert
from .settings import DEFAULT_SCRAPE, RUNBOOK_URL, Settings, parse_interval  # noqa: F401 (re-exported)
from .windows import format_duration, job_matcher, progress_expr, readings_expr, readings_windows, resets_expr

TEMPLATES = ("hangwatch-recording.yml", "hangwatch-alerts.yml", "hangwatch-fleet.yml")
# The longest scrape_timeout the rules allow, as a share of the scrape interval (docs/runbook.md#tuning).
MAX_TIMEOUT_SHARE = 2 / 3
_PLACEHOLDER = re.compile(r"\$\{(\w+)(?::([^}]*))?\}")


# --- placeholders ---------------------------------------------------------------------------

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
        if settings.gpu is not None and name == "hangwatch-alerts.yml" and group["name"] == "hangwatch-alerts":
            # first in the hang alert's group: it must reach Alertmanager first
            rules.insert(0, _render_rule(fault_alert(settings), settings, f"{name}: HangwatchGPUFault"))
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
