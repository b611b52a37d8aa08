"""rules/hangwatch-fleet.yml through ``promtool test rules``, on the series the exporter emits.

A fleet here is a FastChat deployment (controller, workers ``w0``, ``w1``) and a vLLM pair,
scraped every 15 s as in examples/fleet/prometheus.yml. The cases: which member a
shortest-queue or most-headroom dispatcher would pick, and that a hung member is never one;
a controller down is an alert for people and never a restart; a member serving a model its
controller does not list is a warning after 2 minutes, not before; a FastChat worker busy
for long is a warning and never hung (FastChat has no progress counter).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.require import require_binary

ROOT = Path(__file__).resolve().parents[2]
RECORDING, ALERTS = ROOT / "rules" / "hangwatch-recording.yml", ROOT / "rules" / "hangwatch-alerts.yml"
FLEET = ROOT / "rules" / "hangwatch-fleet.yml"
GROUP_ORDER = ["hangwatch-recording", "hangwatch-fleet-recording", "hangwatch-alerts", "hangwatch-fleet-alerts"]
SCRAPE = 15
EVAL = 3   # the groups' interval: a scrape at t is checked at t + 3 s
MODEL = "tiny-vicuna"

# --- members and their series --------------------------------------------------------------

def member(name, module, fleet, port, container=True):
    labels = {"job": "hangwatch", "instance": f"http://127.0.0.1:{port}", "target": name, "fleet": fleet}
    if container:
        labels["container"] = name
    return {"name": name, "module": module, "labels": labels}


W0 = member("w0", "fastchat_worker", "fc", 21002)
W1 = member("w1", "fastchat_worker", "fc", 21003)
W2 = member("w2", "fastchat_worker", "fc", 21004)
CONTROLLER = member("fc-controller", "fastchat_controller", "fc", 21001, container=False)
API = member("fc-api", "fastchat_api", "fc", 8000, container=False)
VLLM_A = member("vllm-a", "backend", "gpu", 8001)
VLLM_B = member("vllm-b", "backend", "gpu", 8002)


def name(metric, labels, **extra):
    merged = {**labels, **extra}
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(merged.items())) + "}"


def worker_series(m, steps, model=MODEL):
    """``steps``: one of ``("ok", in_flight)``, ``("stalled",)``, ``("refused",)`` per scrape."""
    out: dict[str, list] = {}

    def put(metric, i, value, **extra):
        out.setdefault(name(metric, m["labels"], **extra), ["_"] * len(steps))[i] = value

    for i, step in enumerate(steps):
        answered = step[0] == "ok"
        put("hangwatch_up", i, 1 if answered else 0)
        put("hangwatch_connection_stalled", i, 1 if step[0] == "stalled" else 0)
        put("hangwatch_metrics_available", i, 1 if answered else 0)
        put("hangwatch_scrape_duration_seconds", i, 0.01)
        if answered:
            in_flight = step[1]
            for metric, value in (("hangwatch_requests_running", in_flight), ("hangwatch_requests_waiting", 0),
                                  ("hangwatch_requests_in_flight", in_flight), ("hangwatch_engine_asleep", 0)):
                put(metric, i, value)
            put("hangwatch_model_served", i, 1, model=model)
            if in_flight == 0:
                put("hangwatch_probe_success", i, 1)
                put("hangwatch_probe_duration_seconds", i, 0.02)
            put("hangwatch_backend_info", i, 1, engine="fastchat", module=m["module"], models=model, version="")
        else:
            put("hangwatch_backend_info", i, 1, engine="", module=m["module"], models="", version="")
    return _with_staleness(out)


def vllm_series(m, steps, in_flight, kv):
    out: dict[str, list] = {}
    for i in range(steps):
        values = {
            name("hangwatch_up", m["labels"]): 1, name("hangwatch_connection_stalled", m["labels"]): 0,
            name("hangwatch_metrics_available", m["labels"]): 1,
            name("hangwatch_requests_running", m["labels"]): in_flight,
            name("hangwatch_requests_waiting", m["labels"]): 0,
            name("hangwatch_requests_in_flight", m["labels"]): in_flight,
            name("hangwatch_engine_steps_total", m["labels"]): 100 + 50 * i,
            name("hangwatch_engine_tokens_total", m["labels"], kind="generation"): 1000 + 600 * i,
            name("hangwatch_engine_tokens_total", m["labels"], kind="prompt"): 500,
            name("hangwatch_kv_cache_usage_ratio", m["labels"]): kv,
            name("hangwatch_process_start_time_seconds", m["labels"]): 1.7e9,
            name("hangwatch_engine_asleep", m["labels"]): 0,
            name("hangwatch_model_served", m["labels"], model="big"): 1,
            name("hangwatch_backend_info", m["labels"], engine="vllm", module="backend", models="big",
                 version="0.32.0"): 1,
        }
        for key, value in values.items():
            out.setdefault(key, ["_"] * steps)[i] = value
    return out


def front_series(m, steps, models=(MODEL,)):
    """A controller or API server: ``"ok"`` or ``"refused"`` per scrape."""
    out: dict[str, list] = {}

    def put(metric, i, value, **extra):
        out.setdefault(name(metric, m["labels"], **extra), ["_"] * len(steps))[i] = value

    for i, step in enumerate(steps):
        put("hangwatch_up", i, 1 if step == "ok" else 0)
        put("hangwatch_connection_stalled", i, 0)
        put("hangwatch_scrape_duration_seconds", i, 0.01)
        put("hangwatch_backend_info", i, 1, engine="", module=m["module"], models="", version="")
        if step == "ok":
            put("hangwatch_fleet_models_registered", i, len(models))
            for model in models:
                put("hangwatch_fleet_model_registered", i, 1, model=model)
    return _with_staleness(out)


def _with_staleness(out):
    """A series the exporter stops emitting is marked stale at the next scrape, as Prometheus does."""
    for values in out.values():
        for i in range(1, len(values)):
            if values[i] == "_" and values[i - 1] not in ("_", "stale"):
                values[i] = "stale"
    return out


def input_series(*groups):
    merged = {}
    for group in groups:
        merged.update(group)
    return [{"series": key, "values": " ".join(str(v) for v in values)} for key, values in merged.items()]


# --- expectations ----------------------------------------------------------------------------

def at(step: int, extra: int = 0) -> str:
    return f"{step * SCRAPE + EVAL + extra}s"


def samples(record, *pairs):
    """Expected samples of a per-target record: (member, value) pairs."""
    return [{"labels": name(record, m["labels"]), "value": value} for m, value in pairs]


def _alert_rules():
    rules = {}
    for path in (ALERTS, FLEET):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule
    return rules


def _render(template: str, labels: dict) -> str:
    text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda mt: labels.get(mt.group(1), ""), template)
    assert "{{" not in text, template
    return text


def firing(alert: str, m: dict, **extra) -> dict:
    rule = _alert_rules()[alert]
    labels = {**m["labels"], **extra, **rule.get("labels", {})}
    return {"exp_labels": labels,
            "exp_annotations": {k: _render(v, labels) for k, v in rule.get("annotations", {}).items()}}


def run_promtool(tmp_path, name_, series, expr_tests=(), alert_tests=()):
    promtool = require_binary("promtool")
    document = {
        "rule_files": [str(RECORDING), str(ALERTS), str(FLEET)],
        "evaluation_interval": f"{EVAL}s",
        "group_eval_order": GROUP_ORDER,
        "tests": [{"name": name_, "interval": f"{SCRAPE}s", "input_series": series,
                   "promql_expr_test": list(expr_tests), "alert_rule_test": list(alert_tests)}],
    }
    path = tmp_path / f"{name_}.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    return result


def check(result):
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# --- the cases -------------------------------------------------------------------------------

def test_rule_file_is_valid():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "rules", str(FLEET)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dispatchers_pick_the_shortest_queue_and_the_most_headroom_and_never_a_hung_member(tmp_path):
    steps = 12
    # w1 idle until step 5, then accepts connections and never answers (kill -STOP).
    w1_steps = [("ok", 0)] * 6 + [("stalled",)] * 6
    series = input_series(
        worker_series(W0, [("ok", 2)] * steps), worker_series(W1, w1_steps),
        front_series(CONTROLLER, ["ok"] * steps),
        vllm_series(VLLM_A, steps, in_flight=1, kv=0.7), vllm_series(VLLM_B, steps, in_flight=3, kv=0.2))
    members = (W0, W1, VLLM_A, VLLM_B)
    expr_tests = [
        # step 4: everyone answers; w1 has the shortest queue in fc, vllm-a in gpu.
        {"expr": "target:hangwatch_shortest_queue_pick:bool", "eval_time": at(4),
         "exp_samples": samples("target:hangwatch_shortest_queue_pick:bool", (W0, 0), (W1, 1), (VLLM_A, 1), (VLLM_B, 0))},
        {"expr": "target:hangwatch_most_headroom_pick:bool", "eval_time": at(4),
         "exp_samples": samples("target:hangwatch_most_headroom_pick:bool", (VLLM_A, 0), (VLLM_B, 1))},
        {"expr": "target:hangwatch_dispatch_unroutable:bool", "eval_time": at(4),
         "exp_samples": samples("target:hangwatch_dispatch_unroutable:bool", *[(m, 0) for m in members])},
        {"expr": "target:hangwatch_dispatch_eligible:bool", "eval_time": at(4),
         "exp_samples": samples("target:hangwatch_dispatch_eligible:bool", *[(m, 1) for m in members])},
        {"expr": "target:hangwatch_kv_cache_headroom:ratio", "eval_time": at(4),
         "exp_samples": samples("target:hangwatch_kv_cache_headroom:ratio", (VLLM_A, 0.30000000000000004), (VLLM_B, 0.8))},
        {"expr": "round(target:hangwatch_generation_tokens:rate1m)", "eval_time": at(8),  # 600 tokens / 15 s
         "exp_samples": samples("", (VLLM_A, 40), (VLLM_B, 40))},
        # step 7: w1 stalled twice in a row: hung, unroutable, and the pick moves to w0.
        {"expr": "target:hangwatch_dispatch_unroutable:bool", "eval_time": at(7),
         "exp_samples": samples("target:hangwatch_dispatch_unroutable:bool", (W0, 0), (W1, 1), (VLLM_A, 0), (VLLM_B, 0))},
        {"expr": "target:hangwatch_shortest_queue_pick:bool", "eval_time": at(7),
         "exp_samples": samples("target:hangwatch_shortest_queue_pick:bool", (W0, 1), (VLLM_A, 1), (VLLM_B, 0))},
        {"expr": 'fleet:hangwatch_backend_state:count{fleet="fc"} > 0', "eval_time": at(7),
         "exp_samples": [{"labels": 'fleet:hangwatch_backend_state:count{fleet="fc", state="busy"}', "value": 1},
                         {"labels": 'fleet:hangwatch_backend_state:count{fleet="fc", state="hung"}', "value": 1},
                         {"labels": 'fleet:hangwatch_backend_state:count{fleet="fc", state="idle"}', "value": 1}]},
    ]
    alert_tests = [
        {"eval_time": at(4), "alertname": "HangwatchBackendHung", "exp_alerts": []},
        # The same hang alert as any backend, with w1's target and container for the webhook.
        {"eval_time": at(8), "alertname": "HangwatchBackendHung", "exp_alerts": [firing("HangwatchBackendHung", W1)]},
    ]
    check(run_promtool(tmp_path, "dispatch", series, expr_tests, alert_tests))


def test_a_controller_down_is_for_people_and_never_a_restart(tmp_path):
    steps = 10
    series = input_series(worker_series(W0, [("ok", 0)] * steps),
                          front_series(CONTROLLER, ["ok", "ok"] + ["refused"] * (steps - 2)),
                          front_series(API, ["ok"] * steps))
    # Refused from the scrape at 30 s: pending at 30 s, firing once a minute has passed.
    alert_tests = [
        {"eval_time": "87s", "alertname": "HangwatchFleetFrontDown", "exp_alerts": []},
        {"eval_time": "93s", "alertname": "HangwatchFleetFrontDown",
         "exp_alerts": [firing("HangwatchFleetFrontDown", CONTROLLER)]},
        {"eval_time": "93s", "alertname": "HangwatchBackendHung", "exp_alerts": []},
        {"eval_time": "93s", "alertname": "HangwatchFleetMemberDropped", "exp_alerts": []},
    ]
    expr_tests = [  # fronts are not members: no dispatch series for them
        {"expr": 'target:hangwatch_dispatch_unroutable:bool{target=~"fc-.*"}', "eval_time": "93s", "exp_samples": []},
    ]
    result = run_promtool(tmp_path, "front_down", series, expr_tests, alert_tests)
    check(result)
    rule = _alert_rules()["HangwatchFleetFrontDown"]
    assert "action" not in rule["labels"], "a front is never restarted"


def test_a_member_serving_a_model_its_controller_does_not_list_is_a_warning_after_two_minutes(tmp_path):
    steps = 14
    series = input_series(
        worker_series(W0, [("ok", 0)] * steps),
        worker_series(W2, [("ok", 0)] * steps, model="other"),   # dropped: "other" is not listed
        front_series(CONTROLLER, ["ok"] * steps))
    dropped = firing("HangwatchFleetMemberDropped", W2, model="other")
    alert_tests = [
        {"eval_time": "117s", "alertname": "HangwatchFleetMemberDropped", "exp_alerts": []},
        {"eval_time": "123s", "alertname": "HangwatchFleetMemberDropped", "exp_alerts": [dropped]},
    ]
    check(run_promtool(tmp_path, "dropped", series, alert_tests=alert_tests))


def test_no_dropped_warning_when_the_controller_lists_the_model_or_cannot_be_read(tmp_path):
    steps = 14
    series = input_series(
        worker_series(W0, [("ok", 0)] * steps),
        worker_series(W2, [("ok", 0)] * steps, model="other"),
        front_series(CONTROLLER, ["ok"] * 3 + ["refused"] * (steps - 3), models=(MODEL,)),
        front_series(API, ["ok"] * steps, models=(MODEL, "other")))
    alert_tests = [{"eval_time": "183s", "alertname": "HangwatchFleetMemberDropped", "exp_alerts": []}]
    check(run_promtool(tmp_path, "not_dropped", series, alert_tests=alert_tests))


def test_a_fastchat_worker_busy_for_long_is_a_warning_and_never_hung(tmp_path):
    steps = 70   # 17.5 minutes of one long queue, nothing to show progress
    series = input_series(worker_series(W0, [("ok", 3)] * steps), front_series(CONTROLLER, ["ok"] * steps))
    alert_tests = [
        {"eval_time": "897s", "alertname": "HangwatchBusyUnverified", "exp_alerts": []},
        {"eval_time": "903s", "alertname": "HangwatchBusyUnverified",
         "exp_alerts": [firing("HangwatchBusyUnverified", W0)]},
    ] + [{"eval_time": at(step), "alertname": "HangwatchBackendHung", "exp_alerts": []} for step in range(0, steps, 5)]
    expr_tests = [{"expr": 'target:hangwatch_backend_state:current{target="w0"} == 1', "eval_time": at(10),
                   "exp_samples": [{"labels": name("target:hangwatch_backend_state:current", W0["labels"],
                                                   state="busy"), "value": 1}]}]
    check(run_promtool(tmp_path, "busy_unverified", series, expr_tests, alert_tests))


def test_a_busy_fastchat_worker_is_never_hung_however_long(tmp_path):
    """FastChat has no progress counter: the no_progress cause needs measurable progress."""
    steps = 10
    series = input_series(worker_series(W0, [("ok", 3)] * steps))
    alert_tests = [{"eval_time": at(step), "alertname": "HangwatchBackendHung", "exp_alerts": []}
                   for step in range(steps)]
    check(run_promtool(tmp_path, "shipped_busy_unverified", series, alert_tests=alert_tests))


def test_every_fleet_alert_is_for_people_with_a_runbook_section():
    docs = (ROOT / "docs" / "fleets.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
               for line in docs.splitlines() if line.startswith("## ")}
    for group in yaml.safe_load(FLEET.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            assert "for" in rule and rule["labels"]["severity"] in ("critical", "warning"), name
            assert "action" not in rule["labels"], f"{name}: only HangwatchBackendHung restarts"
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
            url = rule["annotations"]["runbook_url"]
            assert url.startswith("docs/fleets.md#") and url.split("#", 1)[1] in anchors, name
