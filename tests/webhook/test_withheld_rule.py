"""The alert docs/fleets.md proposes for withheld restarts, run by promtool on the series the
webhook exports: it fires for the target a limit left alone, with its group and limit, keeps
firing while Alertmanager's re-sends (every 15 minutes) are refused, and stops after."""
import pathlib
import re
import subprocess

import yaml

from tests.support.require import require_binary

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "fleets.md"


def proposed_rule() -> dict:
    block = re.search(r"```yaml\n(- alert: HangwatchRestartWithheld\n.*?)```", DOC.read_text(), re.S)
    assert block, "docs/fleets.md proposes HangwatchRestartWithheld in a yaml block"
    (rule,) = yaml.safe_load(block.group(1))
    return rule


def test_the_proposed_withheld_alert_fires_for_the_target_left_alone(tmp_path):
    promtool = require_binary("promtool")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "withheld", "rules": [proposed_rule()]}]}))
    series = 'hangwatch_webhook_restarts_withheld_total{job="hangwatch_webhook",instance="w:9878",target="%s",group="llama-70b",limit="group"}'
    # r2: withheld at 5m, and again at each 15-minute re-send until 35m; r1 never (it restarted)
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [
            {"series": series % "r1", "values": "0x60"},
            {"series": series % "r2", "values": "0x4 1x14 2x14 3x25"}],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "HangwatchRestartWithheld", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "HangwatchRestartWithheld", "exp_alerts": [
                    {"exp_labels": {"target": "r2", "group": "llama-70b", "limit": "group", "severity": "critical"},
                     "exp_annotations": {k: v.replace("{{ $labels.target }}", "r2")
                                         .replace("{{ $labels.group }}", "llama-70b")
                                         .replace("{{ $labels.limit }}", "group")
                                         for k, v in proposed_rule()["annotations"].items()}}]},
                {"eval_time": "30m", "alertname": "HangwatchRestartWithheld", "exp_alerts": [
                    {"exp_labels": {"target": "r2", "group": "llama-70b", "limit": "group", "severity": "critical"},
                     "exp_annotations": {k: v.replace("{{ $labels.target }}", "r2")
                                         .replace("{{ $labels.group }}", "llama-70b")
                                         .replace("{{ $labels.limit }}", "group")
                                         for k, v in proposed_rule()["annotations"].items()}}]},
                {"eval_time": "58m", "alertname": "HangwatchRestartWithheld", "exp_alerts": []}]}]}))
    done = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
