"""Every query of the Grafana dashboard, evaluated on a real Prometheus holding real series.

The whole chain runs (``demo.stack``: the simulator, the exporter, Prometheus with the shipped
rules retimed to a 2 s scrape, Alertmanager with the example routes, and the real webhook in
dry-run, which Prometheus scrapes too). It goes through idle, busy, a hang that the webhook
decides to restart, and an alert that arrives after the backend recovered (a skipped
restart). Then each panel query and each annotation query is evaluated over the run, with
the dashboard's template variables substituted as Grafana would, and each must return data.
"""
from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from hangwatch.demo.stack import CONTAINER, TARGET, Stack
from hangwatch.demo.wait import wait_until
from tests.support.require import require_binary

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
SCRAPE = 2.0
HUNG = "HangwatchBackendHung"


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's template substitution for ``$name`` and ``${name}``."""
    def value(match):
        name = match.group(1) or match.group(2)
        assert name in variables, f"no value for ${name} in {expr}"
        return variables[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((f"panel {inner['id']} {inner['title']!r} {target['refId']}", target["expr"]))
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation.get("target", {}):
            found.append((f"annotation {annotation['name']!r}", annotation["target"]["expr"]))
    return found


def variables_for(dashboard: dict) -> dict[str, str]:
    """Each variable's "All" value (the default view), plus Grafana's built-in intervals."""
    values = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "datasource":
            values[variable["name"]] = variable["current"]["value"]
        else:
            # Without an allValue Grafana's All is every listed value: here every target there is.
            assert variable.get("includeAll"), variable["name"]
            values[variable["name"]] = variable.get("allValue", ".*")
    # $__rate_interval: max($__interval + scrape interval, 4 x scrape interval) with timeInterval = the scrape.
    values.update(__rate_interval=f"{4 * SCRAPE:g}s", __interval=f"{SCRAPE:g}s", __range="5m")
    return values


def alert_payload(starts_at: str) -> dict:
    labels = {"alertname": HUNG, "severity": "critical", "action": "restart", "target": TARGET, "container": CONTAINER}
    return {"version": "4", "status": "firing", "receiver": "hangwatch-webhook", "groupKey": "e2e",
            "groupLabels": {}, "commonLabels": labels, "commonAnnotations": {}, "externalURL": "",
            "truncatedAlerts": 0, "alerts": [{"status": "firing", "labels": labels, "annotations": {},
                                              "startsAt": starts_at, "endsAt": "0001-01-01T00:00:00Z"}]}


SKIPPED = 'hangwatch_webhook_decisions_total{action="skip",reason="recheck_busy"}'


def first_positive_sample(stack: Stack, selector: str) -> float | None:
    """When Prometheus stored the first sample > 0 of ``selector`` (the webhook's counters
    start at 0 for every reason), or None."""
    for series in stack.query(f"{selector}[5m]"):
        for stamp, value in series["values"]:
            if float(value) > 0:
                return float(stamp)
    return None


def held(stack: Stack, state: str) -> bool:
    """Has ``state`` been the target's state at every rule evaluation for more than one step of
    the range queries below? The rules run every fifth of a scrape, so a state that lasts one
    scrape can fall between two steps of SCRAPE; held this long, every panel shows it."""
    window = f"{2 * SCRAPE + 1:g}s"
    return bool(stack.query(f'min_over_time(target:hangwatch_backend_state:current{{state="{state}"}}[{window}]) == 1'))


@pytest.fixture(scope="module")
def run():
    """The chain after idle, busy, a hang (restart decided, dry-run) and a late alert (skipped)."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    with Stack(scrape_interval=SCRAPE, recheck_interval=1.0) as stack:
        start = time.time()
        try:
            # Each state held for more than one step (held() is the state now, and at every
            # rule evaluation of the last 2 scrapes + 1 s): every panel below shows it.
            wait_until(lambda: held(stack, "idle"), 40, "the idle state held for more than one step")
            wait_until(lambda: stack.query("hangwatch_probe_duration_seconds"), 20, "an idle probe reading")
            stack.drive("busy", n=3)
            wait_until(lambda: held(stack, "busy"), 50, "the busy state held for more than one step")
            stack.drive("frozen")
            wait_until(lambda: stack.webhook_metric("hangwatch_webhook_decisions_total", action="restart"),
                       90, "the webhook's restart decision")
            wait_until(lambda: held(stack, "hung"), 30, "the hung state held for more than one step")
            # The backend recovers; an alert about it arrives late: the webhook re-checks and skips.
            stack.drive("busy", n=2)
            now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
            response = requests.post(stack.webhook.url + "/alerts", json=alert_payload(now), timeout=5,
                                     headers={"Authorization": f"Bearer {stack.token}"})
            assert response.status_code == 200, response.text
            skipped_at = wait_until(lambda: first_positive_sample(stack, SKIPPED), 30,
                                    "Prometheus to scrape the webhook's skip decision")
            # The range queries below step every SCRAPE from `start`: one step must fall after it.
            wait_until(lambda: time.time() > skipped_at + SCRAPE, 2 * SCRAPE, "one more step of the range")
        except BaseException:
            print("\n".join(f"--- {p.name}\n{p.log_tail(40)}" for p in stack.parts))
            raise
        yield stack, start, time.time()


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_every_dashboard_query_returns_data_on_real_series(run, path):
    stack, start, end = run
    dashboard = json.loads(path.read_text())
    variables = variables_for(dashboard)
    empty, failed = [], []
    for where, expr in dashboard_queries(dashboard):
        promql = substitute(expr, variables)
        try:
            result = stack.query_range(promql, start, end, SCRAPE)
        except ValueError as exc:
            failed.append(f"{where}: {exc}")
            continue
        if not any(series["values"] for series in result):
            empty.append(f"{where}: {promql}")
    assert not failed, "queries Prometheus rejected:\n" + "\n".join(failed)
    assert not empty, "queries that returned no data:\n" + "\n".join(empty)


def test_the_state_timeline_shows_idle_busy_and_hung(run):
    stack, start, end = run
    dashboard = json.loads(DASHBOARDS[0].read_text())
    panel = next(p for p in dashboard["panels"] if p["type"] == "state-timeline" and "state" in p["title"].lower())
    mappings = {text["text"]: float(value) for m in panel["fieldConfig"]["defaults"]["mappings"]
                for value, text in m["options"].items()}
    result = stack.query_range(substitute(panel["targets"][0]["expr"], variables_for(dashboard)), start, end, SCRAPE)
    assert [series["metric"] for series in result] == [{"target": TARGET}]
    seen = {float(v) for _, v in result[0]["values"]}
    assert {mappings["idle"], mappings["busy"], mappings["hung"]} <= seen, seen


def test_the_restart_annotation_marks_the_dry_run_decision(run):
    stack, start, end = run
    dashboard = json.loads(DASHBOARDS[0].read_text())
    annotations = {a["name"]: a for a in dashboard["annotations"]["list"]}
    restart = stack.query_range(annotations["hangwatch restart"]["target"]["expr"], start, end, SCRAPE)
    # It names the target and what happened to it: in the demo's dry run, a decision only.
    assert {(s["metric"].get("target"), s["metric"].get("result")) for s in restart} == {(TARGET, "dry_run")}
    skipped = stack.query_range(annotations["hangwatch skipped restart"]["target"]["expr"], start, end, SCRAPE)
    assert {s["metric"].get("reason") for s in skipped} == {"recheck_busy"}
