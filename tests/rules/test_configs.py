"""The shipped rule files and example configs pass the real tools, and keep the seams.

promtool and amtool are real parts: missing in CI is a failure (tests.support.require).
"""
from __future__ import annotations

import json
import re
import subprocess
import zipfile

import pytest
import yaml

from hangwatch.cli import main
from hangwatch.rules import dashboard
from hangwatch.rules.render import RUNBOOK_URL, TEMPLATES, Settings, render_all, render_file, rule_groups
from hangwatch.settings import duration
from tests.support.require import require_binary
from tests.support.wheel import built_wheel

from .scenarios import EVAL_SHARE, ROOT, RULE_FILES

FLEET = ROOT / "rules" / "hangwatch-fleet.yml"

EXAMPLES = ROOT / "examples"
RUNBOOK = ROOT / "docs" / "runbook.md"


def _rules(path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_rule_files_pass_promtool_check_rules():
    result = _run(require_binary("promtool"), "check", "rules", *map(str, RULE_FILES + (FLEET,)))
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
    # A stall reaches the webhook (which restarts only targets that opt in) and always people.
    (["alertname=HangwatchBackendStalled", "severity=warning", "target=vllm-a", "container=vllm-a"],
     "hangwatch-webhook,people"),
    (["alertname=HangwatchBackendThrashing", "severity=warning", "target=vllm-a"], "people"),
    (["alertname=HangwatchRestartWithheld", "severity=critical", "target=vllm-a", "group=g", "limit=group"],
     "people"),
    (["alertname=HangwatchExporterDown", "severity=warning", "job=hangwatch_webhook"], "people"),
    (["alertname=HangwatchBackendDown", "severity=warning", "target=vllm-a"], "people"),
    # Down with a container: the webhook too (it acts only where startup_deadline opts in).
    (["alertname=HangwatchBackendDown", "severity=warning", "target=vllm-a", "container=vllm-a"],
     "hangwatch-webhook,people"),
    (["alertname=HangwatchGPUFault", "severity=critical", "target=vllm-a", "container=vllm-a"], "people"),
    (["alertname=HangwatchWebhookAlertOnly", "severity=critical", "target=vllm-a", "class=hardware"], "people"),
    (["alertname=HangwatchBackendRestarted", "severity=info", "target=vllm-a"], "people"),
    (["alertname=SomethingElse", "severity=critical"], "people"),
])
def test_alertmanager_routes_only_restart_alerts_to_the_webhook_and_every_alert_to_people(labels, receiver):
    result = _run(require_binary("amtool"), "config", "routes", "test",
                  f"--config.file={EXAMPLES / 'alertmanager.yml'}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def runbook_anchors() -> set[str]:
    return {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in RUNBOOK.read_text().splitlines() if line.startswith("#")}


def test_every_alert_has_for_severity_summary_description_and_an_absolute_runbook_link():
    """A runbook_url must work where people read the alert (Alertmanager, Slack, PagerDuty): an
    absolute URL of a section that exists in docs/runbook.md."""
    anchors = runbook_anchors()
    for path in RULE_FILES + (FLEET,):
        for rule in _rules(path):
            if "alert" not in rule:
                continue
            name = rule["alert"]
            assert "for" in rule, name
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
            url = rule["annotations"]["runbook_url"]
            assert url == f"{RUNBOOK_URL}#{name.lower()}", name
            assert name.lower() in anchors, f"{name}: no section in docs/runbook.md"


def test_backend_alerts_name_the_target_in_their_summary():
    for path in RULE_FILES + (FLEET,):
        for rule in _rules(path):
            if "alert" in rule and rule["alert"] not in ("HangwatchExporterDown", "HangwatchExporterAbsent"):
                assert "$labels.target" in rule["annotations"]["summary"], rule["alert"]


def test_the_runbook_link_is_one_constant_pointing_at_the_projects_runbook():
    assert RUNBOOK_URL == "https://github.com/hangwatch/hangwatch/blob/main/docs/runbook.md"
    links = [link["url"] for link in dashboard.links(json.loads(dashboard.shipped()))]
    assert links and all(url.startswith(RUNBOOK_URL + "#") for url in links)
    anchors = runbook_anchors()
    assert {url.split("#", 1)[1] for url in links} <= anchors


def test_only_the_hung_alert_restarts():
    restarting = [rule["alert"] for path in RULE_FILES + (FLEET,) for rule in _rules(path)
                  if rule.get("labels", {}).get("action") == "restart"]
    assert restarting == ["HangwatchBackendHung"]


# -- the generator ---------------------------------------------------------------------------
def test_the_shipped_rule_files_are_what_hangwatch_rules_writes_for_the_defaults(tmp_path):
    """rules/*.yml are reviewable output, never edited by hand: hangwatch rules --out rules."""
    assert main(["rules", "--out", str(tmp_path)]) == 0
    for name in TEMPLATES:
        assert (tmp_path / name).read_text() == (ROOT / "rules" / name).read_text(), \
            f"rules/{name} is stale: run hangwatch rules --out rules"
    assert sorted(p.name for p in (ROOT / "rules").glob("*.yml")) == sorted(TEMPLATES)


def test_rendered_files_are_the_rendered_data():
    """The writer (comments, block scalars) changes nothing a YAML reader sees."""
    for settings in (Settings(), Settings(scrape_interval=3.0, job="llm", runbook_url="https://wiki/x")):
        for name in TEMPLATES:
            groups = rule_groups(name, settings)
            for group in groups:
                for rule in group["rules"]:
                    rule.pop("comment", None)
            assert yaml.safe_load(render_file(name, settings))["groups"] == groups, name


def test_groups_run_every_fifth_of_a_scrape_as_the_truth_table_assumes():
    for scrape in (1.0, 3.0, 15.0, 60.0):
        for name in TEMPLATES:
            for group in rule_groups(name, Settings(scrape_interval=scrape)):
                assert duration(group["interval"], name) == pytest.approx(scrape * EVAL_SHARE)


@pytest.mark.parametrize("scrape", ["1s", "3s", "5s", "15s", "1m"])
def test_rules_for_any_scrape_interval_pass_promtool(scrape, tmp_path):
    assert main(["rules", "--scrape-interval", scrape, "--out", str(tmp_path)]) == 0
    result = _run(require_binary("promtool"), "check", "rules", *map(str, sorted(tmp_path.glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr


def test_wall_clock_durations_stay_and_scrape_durations_scale():
    fast = "".join(render_all(Settings(scrape_interval=5.0)).values())
    assert "for: 10m" in fast and "[10m]" in fast and "for: 2m" in fast      # wall-clock: kept
    assert "interval: 1s" in fast and "for: 1s" in fast                       # a fifth of a scrape
    assert "[12500ms]" in fast and "[17500ms]" in fast                        # three readings: 2.5 and 3.5 scrapes
    assert "[22500ms]" in fast                                                # and 4.5 while a scrape is late
    # llama.cpp's 30 s grace at 5 s: seven readings (six intervals), 6.5, 7.5 and 8.5 scrapes
    grace = next(r for r in rule_groups("hangwatch-recording.yml", Settings(scrape_interval=5.0))[0]["rules"]
                 if r["record"] == "target:hangwatch_engine_progress:within_grace")["expr"]
    llamacpp = grace[grace.index('engine=~"llamacpp|tgi"'):grace.index('engine="sglang"')]  # one branch: same readings
    assert "[32500ms]" in llamacpp and "[37500ms]" in llamacpp and "[42500ms]" in llamacpp and ">= 7" in llamacpp
    sglang = grace[grace.index('engine="sglang"'):]  # 45 s: ten readings, 9.5, 10.5 and 11.5 scrapes
    assert "[47500ms]" in sglang and "[52500ms]" in sglang and "[57500ms]" in sglang and ">= 10" in sglang


def test_a_grace_of_three_readings_reuses_the_recorded_progress():
    """At 15 s, llama.cpp's and TGI's 30 s span three readings: the grace branch reads the 3-reading
    progress recorded before it instead of computing the costly expression again."""
    grace = next(r for r in rule_groups("hangwatch-recording.yml", Settings())[0]["rules"]
                 if r["record"] == "target:hangwatch_engine_progress:within_grace")["expr"]
    shared = grace[grace.index('engine=~"llamacpp|tgi"'):grace.index('engine="sglang"')]
    assert "target:hangwatch_engine_progress:changes_3scrapes" in shared and "changes(" not in shared
    assert grace.count("changes(hangwatch_engine_progress_fingerprint") == 3  # sglang's four readings, three ranges


def test_jobs_and_runbook_are_the_users(tmp_path):
    assert main(["rules", "--job", "llm-probe", "--exporter-job", "llm-exporter", "--webhook-job", "llm-restarter",
                 "--runbook-url", "https://wiki.example.com/hw", "--out", str(tmp_path)]) == 0
    text = "".join(p.read_text() for p in tmp_path.glob("*.yml"))
    assert 'up{job=~"llm-probe"}' in text and 'up{job=~"llm-probe|llm-exporter|llm-restarter"}' in text
    assert 'job=~"hangwatch' not in text and "github.com" not in text
    assert "runbook_url: https://wiki.example.com/hw#hangwatchbackendhung" in text
    dash = tmp_path / "dash"
    assert main(["dashboard", "--runbook-url", "https://wiki.example.com/hw", "--out", str(dash)]) == 0
    links = dashboard.links(json.loads((dash / "hangwatch.json").read_text()))
    assert links and all(link["url"].startswith("https://wiki.example.com/hw#") for link in links)


@pytest.mark.parametrize("argv, message", [
    (["rules", "--scrape-interval", "15", "--out", "x"], "is not a duration"),
    (["rules", "--scrape-interval", "50ms", "--out", "x"], "out of range"),
    (["rules", "--runbook-url", "docs/runbook.md", "--out", "x"], "--runbook-url"),
    (["rules", "--job", 'a"b', "--out", "x"], "--job"),
    (["dashboard", "--runbook-url", "wiki", "--out", "x"], "--runbook-url"),
])
def test_bad_flags_are_one_line_and_exit_64(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 64
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "x").exists()


def test_the_wheel_ships_the_templates_and_the_dashboard():
    names = zipfile.ZipFile(built_wheel()).namelist()
    for name in TEMPLATES:
        assert f"hangwatch/rules/templates/{name}" in names
    assert "hangwatch/rules/render.py" in names and "hangwatch/dashboards/hangwatch.json" in names
