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

from hangwatch.observation import Observation, ProbeResult
from hangwatch.reading import Reading
from hangwatch.rules.render import RUNBOOK_URL
from tests.support.require import require_binary

from .gen_promtool import runbook_severities
from .observations import exported_samples

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"   # the rendered defaults (test_configs keeps them equal to what `hangwatch rules` writes)
RECORDING, ALERTS = RULES / "hangwatch-recording.yml", RULES / "hangwatch-alerts.yml"
FLEET = RULES / "hangwatch-fleet.yml"
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


def series_from(m, observations) -> dict[str, list]:
    """What Prometheus stores for a member: the exporter's own families (``tests.support.exposition.probe_text``) for each
    scrape's observation, plus ``up``; a series missing from one scrape is marked stale."""
    out: dict[str, list] = {}
    for i, observation in enumerate(observations):
        for key, value in exported_samples(observation, m["module"], m["labels"]).items():
            out.setdefault(key, ["_"] * len(observations))[i] = _number(value)
    return _with_staleness(out)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def worker_series(m, steps, model=MODEL):
    """``steps``: one of ``("ok", in_flight)``, ``("stalled",)``, ``("refused",)`` per scrape."""
    observations = []
    for i, step in enumerate(steps):
        if step[0] == "ok":
            probe = ProbeResult("answered", 0.02, "answered", kind="worker_generate") if step[1] == 0 else None
            reading = Reading(engine="fastchat", running=float(step[1]), waiting=0.0, models=(model,))
            observations.append(Observation(i * SCRAPE, "ok", reading=reading, probe=probe))
        else:
            observations.append(Observation(i * SCRAPE, "timeout" if step[0] == "stalled" else "refused"))
    return series_from(m, observations)


def vllm_series(m, steps, in_flight, kv):
    return series_from(m, [Observation(i * SCRAPE, "ok", reading=Reading(
        engine="vllm", running=float(in_flight), waiting=0.0, steps=100.0 + 50 * i,
        generation_tokens=1000.0 + 600 * i, prompt_tokens=500.0, kv_cache_usage=kv, process_start=1.7e9,
        models=("big",), version="0.32.0")) for i in range(steps)])


def front_series(m, steps, models=(MODEL,)):
    """A controller or API server: ``"ok"`` or ``"refused"`` per scrape."""
    return series_from(m, [Observation(i * SCRAPE, "ok", listed_models=tuple(models)) if step == "ok"
                           else Observation(i * SCRAPE, "refused") for i, step in enumerate(steps)])


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


def firing(alert: str, m: dict, **extra) -> str:
    """The ALERTS series of a firing alert: the member's target labels (DESIGN.md: every alert
    keeps them), the severity docs/runbook.md tells people, ``action="restart"`` on the hang
    alert only - never read from the rules under test."""
    labels = {**m["labels"], **extra, "alertname": alert, "alertstate": "firing",
              "severity": runbook_severities()[alert]}
    if alert == "HangwatchBackendHung":
        labels["action"] = "restart"
    return name("ALERTS", labels)


def _as_expr_test(test: dict) -> dict:
    return {"expr": f'ALERTS{{alertname="{test["alertname"]}", alertstate="firing"}}', "eval_time": test["eval_time"],
            "exp_samples": [{"labels": series, "value": 1} for series in test["exp_alerts"]]}


def run_promtool(tmp_path, name_, series, expr_tests=(), alert_tests=()):
    promtool = require_binary("promtool")
    document = {
        "rule_files": [str(RECORDING), str(ALERTS), str(FLEET)],
        "evaluation_interval": f"{EVAL}s",
        "group_eval_order": GROUP_ORDER,
        "tests": [{"name": name_, "interval": f"{SCRAPE}s", "input_series": series,
                   "promql_expr_test": list(expr_tests) + [_as_expr_test(a) for a in alert_tests]}],
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
    assert "action" not in firing("HangwatchFleetFrontDown", CONTROLLER), "a front is never restarted"


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
    docs = (ROOT / "docs" / "runbook.md").read_text()
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
            assert url.startswith(RUNBOOK_URL + "#") and url.split("#", 1)[1] in anchors, name
