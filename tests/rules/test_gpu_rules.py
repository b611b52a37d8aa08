"""HangwatchGPUFault through ``promtool test rules``: a hung or stalled backend whose join labels
match a GPU group that reported an Xid (either naming generation of dcgm-exporter's series) within
the window raises it; an Xid elsewhere, an old one, a zero, or an idle backend do not. The tests
are mutation-checked: the same cases against a broken join fail."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from hangwatch.rules import gpu
from hangwatch.rules.render import Settings
from tests.support.require import require_binary

STATE = "target:hangwatch_backend_state:current"
BACKEND = {"job": "hangwatch", "instance": "http://vllm-a:8000", "target": "vllm-a", "container": "vllm-a",
           "node": "gpu-1"}
DCGM = {"job": "dcgm", "instance": "gpu-1:9400", "gpu": "0", "UUID": "GPU-0", "node": "gpu-1"}


def series(metric: str, labels: dict, values: str) -> dict:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


def states(hung: str, stalled: str = "0x40", idle: str = "0x40") -> list[dict]:
    return [series(STATE, {**BACKEND, "state": "hung"}, hung), series(STATE, {**BACKEND, "state": "stalled"}, stalled),
            series(STATE, {**BACKEND, "state": "idle"}, idle)]


def fault_alert() -> dict:
    labels = {k: v for k, v in BACKEND.items()} | {"severity": "critical"}
    return {"exp_labels": labels}


CASES = {
    "old_generation_xid_during_a_hang": (states("0 0 1x38"), [series("DCGM_FI_DEV_XID_ERRORS", DCGM, "0 48x39")],
                                         [fault_alert()]),
    "new_generation_xid_count_during_a_stall": (states("0x40", "0 0 1x38"),
                                                [series("DCGM_EXP_XID_ERRORS_COUNT", {**DCGM, "xid": "79"},
                                                        "1x40")], [fault_alert()]),
    "xid_on_another_node": (states("0 0 1x38"), [series("DCGM_FI_DEV_XID_ERRORS", {**DCGM, "node": "gpu-2"},
                                                        "48x40")], []),
    "xid_while_idle": (states("0x40", idle="1x40"), [series("DCGM_FI_DEV_XID_ERRORS", DCGM, "48x40")], []),
    "no_xid_during_a_hang": (states("0 0 1x38"), [series("DCGM_FI_DEV_XID_ERRORS", DCGM, "0x40")], []),
    "xid_older_than_the_window": (states("0x30 1x10"), [series("DCGM_FI_DEV_XID_ERRORS", DCGM, "48 0x39")], []),
}


def gpu_settings() -> Settings:
    return Settings(gpu=(("node",), gpu.DEFAULT_WINDOW, gpu.XID_SERIES))


def write_rules(out) -> list:
    from hangwatch.rules.render import write
    settings = gpu_settings()
    return [*write(out, settings, ["hangwatch-alerts.yml"]), gpu.write(out, settings)]


def promtool_file(tmp_path, rules_paths, name="gpu") -> tuple[int, str]:
    promtool = require_binary("promtool")
    tests = []
    for case, (state_series, xid, expected) in CASES.items():
        tests.append({"name": case, "interval": "1m", "input_series": state_series + xid,
                      "alert_rule_test": [{"eval_time": "39m", "alertname": "HangwatchGPUFault",
                                           "exp_alerts": [dict(e, exp_annotations=annotations()) for e in expected]}]})
    document = {"rule_files": [str(p) for p in rules_paths], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout[-4000:] + done.stderr[-2000:]


def annotations() -> dict:
    rule = gpu.fault_alert(gpu_settings())
    text = {k: v.replace("{{ $labels.target }}", "vllm-a").replace("{{ $labels.container }}", "vllm-a")
            for k, v in rule["annotations"].items()}
    text["runbook_url"] = f"{Settings().runbook_url}#hangwatchgpufault"
    return text


def test_gpu_fault_fires_only_for_a_hung_backend_beside_a_recent_xid(tmp_path):
    code, output = promtool_file(tmp_path, write_rules(tmp_path / "rules"))
    assert code == 0, output


@pytest.mark.parametrize("broken", [("and on (node)", "and on ()"), ("> 0)", ">= 0)"),
                                    ('state=~"hung|stalled"', 'state=~"hung|stalled|idle"')])
def test_the_cases_catch_a_broken_join(tmp_path, broken):
    paths = write_rules(tmp_path / "rules")
    path = next(p for p in paths if broken[0] in p.read_text())
    path.write_text(path.read_text().replace(broken[0], broken[1]))
    code, _ = promtool_file(tmp_path, paths, "broken")
    assert code != 0


def test_the_cli_renders_it_only_when_asked(tmp_path):
    from hangwatch.cli import main
    assert main(["rules", "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / gpu.NAME).exists()
    assert main(["rules", "--gpu-labels", "node,gpu_slot", "--gpu-xid-series", "DCGM_FI_DEV_XID_LAST_VALUE",
                 "--out", str(tmp_path / "gpu")]) == 0
    text = (tmp_path / "gpu" / gpu.NAME).read_text()
    alerts = (tmp_path / "gpu" / "hangwatch-alerts.yml").read_text()
    assert "max by (node, gpu_slot)" in text and "|DCGM_FI_DEV_XID_LAST_VALUE" in text
    assert "and on (node, gpu_slot)" in alerts
    assert alerts.index("alert: HangwatchGPUFault") < alerts.index("alert: HangwatchBackendHung")
    assert "HangwatchGPUFault" not in (tmp_path / "plain" / "hangwatch-alerts.yml").read_text()
    assert main(["rules", "--gpu-labels", "state", "--out", str(tmp_path / "bad")]) == 64
    assert main(["rules", "--gpu-window", "1h", "--out", str(tmp_path / "bad")]) == 64
