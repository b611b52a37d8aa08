"""The shipped rule files and example configs pass the real tools, and keep the seams.

promtool and amtool are real parts: missing in CI is a failure (tests.support.require).
"""
from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.support.require import require_binary

from .gen_promtool import load_retime
from .scenarios import ROOT, RULE_FILES

EXAMPLES = ROOT / "examples"
RUNBOOK = ROOT / "docs" / "runbook.md"


def _alerts() -> list[dict]:
    groups = yaml.safe_load(RULE_FILES[1].read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_rule_files_pass_promtool_check_rules():
    result = _run(require_binary("promtool"), "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_prometheus_config_passes_promtool_check_config():
    result = _run(require_binary("promtool"), "check", "config", str(EXAMPLES / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 rule files found" in result.stdout


def test_example_alertmanager_config_passes_amtool_check_config():
    result = _run(require_binary("amtool"), "check-config", str(EXAMPLES / "alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("labels, receiver", [
    # The restart alert reaches the webhook and people: a person always hears of a hang.
    (["alertname=HangwatchBackendHung", "action=restart", "severity=critical", "target=vllm-a",
      "container=vllm-a"], "hangwatch-webhook,people"),
    (["alertname=HangwatchWebhookCircuitOpen", "severity=critical", "target=vllm-a"], "people"),
    (["alertname=HangwatchExporterDown", "severity=warning", "job=hangwatch_webhook"], "people"),
    (["alertname=HangwatchBackendDown", "severity=warning", "target=vllm-a"], "people"),
    (["alertname=HangwatchBackendRestarted", "severity=info", "target=vllm-a"], "people"),
    (["alertname=SomethingElse", "severity=critical"], "people"),
])
def test_alertmanager_routes_only_restart_alerts_to_the_webhook_and_every_alert_to_people(labels, receiver):
    result = _run(require_binary("amtool"), "config", "routes", "test",
                  f"--config.file={EXAMPLES / 'alertmanager.yml'}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_every_alert_has_for_severity_summary_description_and_a_runbook_section():
    anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
               for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    for rule in _alerts():
        name = rule["alert"]
        assert "for" in rule, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/runbook.md#"), name
        assert url.split("#", 1)[1] in anchors, f"{name}: no section for {url} in docs/runbook.md"


def test_only_the_hung_alert_restarts():
    restarting = [rule["alert"] for rule in _alerts() if rule["labels"].get("action") == "restart"]
    assert restarting == ["HangwatchBackendHung"]
    hung = next(rule for rule in _alerts() if rule["alert"] == "HangwatchBackendHung")
    assert hung["labels"]["severity"] == "critical"


def test_retime_scales_seconds_and_keeps_minutes():
    retime = load_retime()
    text = RULE_FILES[0].read_text() + RULE_FILES[1].read_text()
    fast = retime.retime_text(text, 3.0)
    assert "[45s]" in text and "[9s]" in fast and "[45s]" not in fast
    assert "[30s]" in text and "[6s]" in fast
    assert "interval: 600ms" in fast and "for: 600ms" in fast
    assert "for: 10m" in fast and "[10m]" in fast          # wall-clock: kept
    assert "for: 2m" in retime.retime_text(text, 3.0, all_durations=True)
    assert retime.retime_text(text, 15.0) == text            # the shipped files are the 15 s ones


def test_retimed_rules_pass_promtool(tmp_path):
    promtool = require_binary("promtool")
    retime = load_retime()
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(retime.retime_text(path.read_text(), 1.0, all_durations=True))
    result = _run(promtool, "check", "rules", *map(str, sorted(tmp_path.glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr


def test_grace_rule_is_generated_from_the_engine_table():
    """The PromQL grace windows and hangwatch/verdict.py read the same min_grace values."""
    from hangwatch.engines import ENGINES
    retime = load_retime()
    text = RULE_FILES[0].read_text()
    start, end = text.index(retime.GRACE_BEGIN), text.index(retime.GRACE_END) + len(retime.GRACE_END)
    assert text[start:end] == retime.grace_rule_text(), "run: python rules/retime.py --regen-grace rules/hangwatch-recording.yml"
    for engine in ENGINES:
        marker = f'engine="{engine.name}"'
        assert (marker in text[start:end]) == (engine.min_grace > 0), engine.name


def test_grace_windows_stay_wall_clock_when_retimed():
    retime = load_retime()
    fast = retime.retime_text(RULE_FILES[0].read_text(), 3.0)
    assert "changes(hangwatch_engine_steps_total[33s])" in fast     # llama.cpp: 30 s grace + one 3 s scrape
    assert "changes(hangwatch_engine_steps_total[48s])" in fast     # SGLang: 45 s + 3 s
    assert "changes(hangwatch_engine_steps_total[9s])" in fast      # everything else: three scrapes
