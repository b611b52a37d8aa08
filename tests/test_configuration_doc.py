"""docs/configuration.md against the code, both ways: every key the config loaders accept,
every flag the command lines define, every environment and compose variable is documented
with its real default, and nothing documented is unknown to the code.

The known keys come from the loaders themselves (their "unknown key (known: ...)" errors),
the flags from the argparse parsers, the defaults from the config dataclasses.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
from pathlib import Path

import pytest

from hangwatch.cli import build_parser
from hangwatch.exporter.config import ConfigError as ExporterConfigError
from hangwatch.exporter.config import ExporterConfig, exporter_config
from hangwatch.settings import duration
from hangwatch.target_options import TargetOptions
from hangwatch.webhook.config import Budget, Config, Recheck, Target, parse_config
from hangwatch.webhook.config import ConfigError as WebhookConfigError
from hangwatch.webhook.escalation import Escalate

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "configuration.md").read_text()
ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+?) \|", re.M)
NO_DEFAULT = {"required", "none", "—", "detected", "empty"}


def section(title: str) -> str:
    """The text under the heading that starts with ``title`` (up to the next heading of its level)."""
    match = re.search(rf"^(#+) {re.escape(title)}.*$", DOC, re.M)
    assert match, f"docs/configuration.md has no section {title!r}"
    level = len(match.group(1))
    rest = DOC[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


def rows(title: str) -> dict[str, str]:
    return {key: default.strip().strip("`") for key, default in ROW.findall(section(title))}


def known_keys(parse, raw, error) -> set[str]:
    with pytest.raises(error) as caught:
        parse(raw)
    listed = re.search(r"\(known: ([^)]*)\)", str(caught.value))
    assert listed, str(caught.value)
    return set(listed.group(1).split(", "))


def value_of(text: str):
    """A documented default as a Python value (durations in seconds)."""
    if text in NO_DEFAULT:
        return None
    if text in ("false", "off"):
        return False
    if text == "[]":
        return ()
    if text.startswith("[") and text.endswith("]"):
        return tuple(part.strip() for part in text[1:-1].split(","))
    if re.fullmatch(r"\d+(\.\d+)?(ms|s|m|h)", text):
        return duration(text, "doc")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    return text


# -- exporter config ---------------------------------------------------------------------------
def test_exporter_config_keys_are_documented_both_ways():
    known = known_keys(exporter_config, {"no_such_key": 1}, ExporterConfigError)
    target = known_keys(exporter_config, {"targets": [{"url": "http://a:1", "no_such_key": 1}]},
                        ExporterConfigError)
    forensics = known_keys(exporter_config, {"forensics": {"no_such_key": 1}}, ExporterConfigError)
    assert set(rows("Exporter config")) == (known - {"forensics"}) | {f"targets[].{k}" for k in target} | {
        f"forensics.{k}" for k in forensics}


def test_exporter_config_defaults_are_the_documented_ones():
    defaults = ExporterConfig()
    target_defaults = {f.name: f.default for f in dataclasses.fields(TargetOptions)}
    for key, text in rows("Exporter config").items():
        if key.startswith("targets[]."):
            name = key.split(".")[1]
            actual = target_defaults["api_key" if name == "api_key_file" else name]
            actual = None if actual is dataclasses.MISSING else actual
            assert value_of(text) == actual, key
        elif key == "api_key_file":
            assert value_of(text) == defaults.api_key, key
        elif key.startswith("forensics."):
            name = {"token_file": "token"}.get(key.split(".")[1], key.split(".")[1])  # a file's default: its secret's
            actual = getattr(defaults.forensics, name)
            assert value_of(text) == (None if actual == () else actual), key
        else:
            assert value_of(text) == getattr(defaults, key), key


# -- webhook config ----------------------------------------------------------------------------
TARGET = {"name": "a", "container": "a", "url": "http://127.0.0.1:8000"}


def webhook_keys() -> set[str]:
    top = known_keys(parse_config, {"no_such_key": 1, "targets": [TARGET]}, WebhookConfigError)
    recheck = known_keys(parse_config, {"recheck": {"no_such_key": 1}, "targets": [TARGET]}, WebhookConfigError)
    budget = known_keys(parse_config, {"budget": {"no_such_key": 1}, "targets": [TARGET]}, WebhookConfigError)
    fleet = known_keys(parse_config, {"fleet_budget": {"no_such_key": 1}, "targets": [TARGET]}, WebhookConfigError)
    host = known_keys(parse_config, {"docker_hosts": {"h": {"no_such_key": 1}}, "targets": [TARGET]},
                      WebhookConfigError)
    tls = known_keys(parse_config, {"docker_hosts": {"h": {"url": "tcp://h:2376", "tls": {"no_such_key": 1}}},
                                    "targets": [TARGET]}, WebhookConfigError)
    target = known_keys(parse_config, {"targets": [dict(TARGET, no_such_key=1)]}, WebhookConfigError)
    escalate = known_keys(parse_config, {"escalate": {"no_such_key": 1}, "targets": [TARGET]}, WebhookConfigError)
    return ({f"escalate.{k}" for k in escalate} | top | {f"recheck.{k}" for k in recheck} | {f"budget.{k}" for k in budget}
            | {f"fleet_budget.{k}" for k in fleet} | {f"docker_hosts.<name>.{k}" for k in host - {"tls"}}
            | {f"docker_hosts.<name>.tls.{k}" for k in tls} | {f"targets[].{k}" for k in target})


def test_webhook_config_keys_are_documented_both_ways():
    documented = set(rows("Webhook config"))
    code = webhook_keys() - {"recheck", "budget", "fleet_budget"}  # documented key by key: recheck.interval, ...
    assert documented == code, documented ^ code


def test_webhook_config_defaults_are_the_documented_ones():
    top, recheck, budget = Config(targets=()), Recheck(), Budget()
    target_defaults = {f.name: f.default for f in dataclasses.fields(TargetOptions) + dataclasses.fields(Target)}
    for key, text in rows("Webhook config").items():
        if key.startswith("recheck."):
            actual = getattr(recheck, key.split(".")[1])
        elif key.startswith("budget."):
            actual = getattr(budget, key.split(".")[1])
        elif key.startswith("fleet_budget."):
            actual = getattr(top.fleet_budget, key.split(".")[1])
        elif key.startswith("escalate."):
            actual = getattr(Escalate(), key.split(".")[1])
        elif key.endswith(".insecure_tcp"):
            actual = False  # a flag read at start-up (docker_hosts.<name> and targets[]), kept nowhere else
        elif key.startswith("docker_hosts"):
            actual = None  # none declared; each declared host's url and tls files are required
        elif key == "targets[].docker_host":
            actual = target_defaults["docker_host"].name  # the default engine
        elif key.startswith("targets[]."):
            name = key.split(".")[1]
            actual = target_defaults["api_key" if name == "api_key_file" else name]
            actual = None if actual is dataclasses.MISSING else actual
        elif key == "targets":
            actual = None  # required
        else:
            actual = getattr(top, key)
        assert value_of(text) == actual, f"{key}: documented {text!r}, code {actual!r}"


# -- command lines -----------------------------------------------------------------------------
def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("command", ["check", "exporter", "webhook", "rules", "dashboard", "forensics", "incidents"])
def test_every_flag_is_documented_with_its_default(command):
    documented = rows(f"`hangwatch {command}")
    flags = {}
    for action in subcommands()[command]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = max(action.option_strings, key=len) if action.option_strings else action.dest.upper()
        flags[name] = action
    assert set(documented) == set(flags), set(documented) ^ set(flags)
    for name, action in flags.items():
        default = action.default
        if action.required or not action.option_strings:
            default = None
        expected = value_of(documented[name])
        if name == "--module":  # None means "backend" (cli.run_check)
            default = "backend"
        assert expected == default, f"{command} {name}: documented {documented[name]!r}, code {default!r}"


def help_flags(main) -> set[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    usage = out.getvalue().split("\n\n")[0]  # the usage lines list exactly the parser's options
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", usage)) - {"--help"}


def test_simulator_flags_are_documented_both_ways():
    from hangwatch.simulator import main
    assert set(rows("`hangwatch simulate")) == help_flags(main)
    assert set(subcommands()) == {"check", "exporter", "webhook", "simulate", "rules", "dashboard", "forensics",
                                  "incidents", "demo"}


def test_demo_flags_are_documented_both_ways():
    from hangwatch.demo.run import main
    documented = set(re.findall(r"`(--[a-z-]+)`", section("`hangwatch demo`")))
    assert documented == help_flags(main)


# -- environment and compose variables ----------------------------------------------------------
def test_environment_variables_are_documented_both_ways():
    code = set()
    for package in ("hangwatch", "exporter", "webhook", "simulator"):  # everything installed
        for path in (REPO / package).rglob("*.py"):
            code |= set(re.findall(r"[\"'](HANGWATCH_[A-Z_]+)[\"']", path.read_text()))
    assert set(rows("Environment variables")) == code


def test_compose_variables_are_documented_with_their_defaults():
    text = "".join(path.read_text() for path in sorted(REPO.glob("docker-compose*.yml")))
    code = {}
    for name, default in re.findall(r"\$\{(\w+)(?::-([^}]*))?\}", text):
        code[name] = default
    documented = rows("docker-compose.yml variables")
    assert set(documented) == set(code), set(documented) ^ set(code)
    for name, default in code.items():
        assert (documented[name] if documented[name] not in NO_DEFAULT else "") == default, name
