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
from harness.settled import shows
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


STATE_SERIES = "target:hangwatch_backend_state:current"


def state_panel(dashboard: dict) -> tuple[str, dict[str, float]]:
    """The state-timeline panel's query (variables substituted) and its value for each state."""
    panel = next(p for p in dashboard["panels"] if p["type"] == "state-timeline" and "state" in p["title"].lower())
    mappings = {text["text"]: float(value) for m in panel["fieldConfig"]["defaults"]["mappings"]
                for value, text in m["options"].items()}
    return substitute(panel["targets"][0]["expr"], variables_for(dashboard)), mappings


def panel_shows(stack: Stack, start: float, state: str, since: float) -> list[float]:
    """The settled steps since ``since`` at which the state panel's own range query — from the
    run's ``start``, every SCRAPE, as the assertions below read it — shows ``state``. A settled
    step reads the same later (``harness.settled``), so once this is non-empty the evidence the
    assertion needs exists; an instant query over a short window is only a proxy for it."""
    expr, mappings = state_panel(json.loads(DASHBOARDS[0].read_text()))
    return shows(stack, expr, STATE_SERIES, start, SCRAPE, mappings[state], since)


def wait_shown(stack: Stack, start: float, state: str, since: float, timeout: float) -> list[float]:
    """Wait (one deadline) until the panel's range query shows ``state`` at a settled step."""
    return wait_until(lambda: panel_shows(stack, start, state, since), timeout,
                      f"the state panel's range query to show {state} at a settled step", interval=SCRAPE / 4)


@pytest.fixture(scope="module")
def run():
    """The chain after idle, busy, a hang (restart decided, dry-run) and a late alert (skipped)."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    with Stack(scrape_interval=SCRAPE, recheck_interval=1.0) as stack:
        start = time.time()
        try:
            # Each phase ends only when the evidence the assertions read exists: the state panel's
            # own range query (from `start`, every SCRAPE) shows the phase's state at a settled step.
            wait_shown(stack, start, "idle", start, 40)
            wait_until(lambda: stack.query("hangwatch_probe_duration_seconds"), 20, "an idle probe reading")
            busy_from = time.time()
            stack.drive("busy", n=3)
            wait_shown(stack, start, "busy", busy_from, 50)
            hung_from = time.time()
            stack.drive("frozen")
            wait_until(lambda: stack.webhook_metric("hangwatch_webhook_decisions_total", action="restart"),
                       90, "the webhook's restart decision")
            wait_shown(stack, start, "hung", hung_from, 30)
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
    expr, mappings = state_panel(dashboard)
    result = stack.query_range(expr, start, end, SCRAPE)
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
