"""The Grafana dashboard and its provisioning: Grafana's own schema, unique uids, queries that
name real series.

The schema check is Grafana's types (npm ``@grafana/schema``) and ``tsc``: ``grafana/check``
writes the dashboard as a TypeScript literal that must satisfy ``Dashboard`` exactly (enum
values, no unknown keys) and each panel's options its panel plugin's ``Options``. That every
query returns data on a real Prometheus is ``tests/e2e/test_dashboard_queries.py``.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.support.require import require, require_binary

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "grafana"
CHECK = GRAFANA / "check"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "hangwatch.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "hangwatch.yml"
RECORDING_RULES = REPO / "rules" / "hangwatch-recording.yml"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every Prometheus annotation."""
    found = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
             for p in panels(dashboard) for t in p.get("targets", [])]
    found += [(f"annotation {a['name']!r}", a["target"]["expr"])
              for a in dashboard["annotations"]["list"] if "expr" in a.get("target", {})]
    return found


# -- Grafana's schema, through tsc ------------------------------------------------------------
@pytest.fixture(scope="module")
def npm_check():
    """grafana/check with its pinned packages installed (``npm ci``, as CI does)."""
    npm = require_binary("npm")
    require_binary("node")
    if not (CHECK / "node_modules" / "@grafana" / "schema").is_dir():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefix", str(CHECK)],
                              capture_output=True, text=True, timeout=600)
        require(done.returncode == 0, f"npm ci in grafana/check: {done.stderr[-2000:]}")
    return npm


# One broken copy of the dashboard per mistake; each must fail tsc, naming the mistake.
MISTAKES = {
    "unknown-custom-key": (lambda d: panels(d)[2]["fieldConfig"]["defaults"]["custom"].update(fillOpactiy=10),
                           "fillOpactiy"),
    "bad-enum-value": (lambda d: panels(d)[1]["options"].update(showValue="sometimes"), '"sometimes"'),
    "unknown-dashboard-key": (lambda d: d.update(refreshEvery="10s"), "refreshEvery"),
    "unknown-query-key": (lambda d: panels(d)[2]["targets"][0].update(exprr="up"), "exprr"),
}
TS_ERROR = re.compile(r"^(?:.*/)?([\w.-]+\.ts)\(\d+,\d+\): error ")


@pytest.fixture(scope="module")
def tsc_errors(npm_check, tmp_path_factory) -> dict[str, list[str]]:
    """ONE tsc run (tsc is the slow part) over the shipped dashboards, ``dashboard.ts`` and a
    broken copy per mistake: the errors, by generated file (``<dashboard>.ts``,
    ``broken-<mistake>.ts``)."""
    sources = tmp_path_factory.mktemp("dashboards")
    for path in DASHBOARDS:
        (sources / path.name).write_text(path.read_text())
    for name, (mistake, _) in MISTAKES.items():
        dashboard = copy.deepcopy(load(DASHBOARDS[0]))
        mistake(dashboard)
        (sources / f"broken-{name}.json").write_text(json.dumps(dashboard))
    # Inside grafana/check so @grafana/schema resolves; a folder of this run's own (two xdist
    # workers each build one), removed afterwards.
    out = Path(tempfile.mkdtemp(prefix=".checked-", dir=CHECK))
    try:
        subprocess.run(["node", "gen.mjs", str(sources), str(out)], cwd=CHECK, check=True, timeout=60)
        (out / "tsconfig.json").write_text(json.dumps({"extends": "../tsconfig.json",
                                                       "include": ["*.ts", "../dashboard.ts", "../types.ts"]}))
        done = subprocess.run(["node", "node_modules/typescript/bin/tsc", "--noEmit", "--pretty", "false",
                               "-p", str(out)], cwd=CHECK, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    errors: dict[str, list[str]] = {}
    current = None
    for line in (done.stdout + done.stderr).splitlines():
        match = TS_ERROR.match(line)
        if match:
            current = match.group(1)
            errors.setdefault(current, []).append(line)
        elif current and line.startswith(" "):
            errors[current][-1] += "\n" + line
        elif line.strip():
            errors.setdefault("(tsc)", []).append(line)
    assert errors or done.returncode == 0, done.stdout + done.stderr  # tsc failed without saying why
    return errors


def test_dashboards_satisfy_grafanas_own_schema(tsc_errors):
    shipped = {f"{p.stem}.ts" for p in DASHBOARDS} | {"dashboard.ts", "types.ts", "(tsc)"}
    found = {name: lines for name, lines in tsc_errors.items() if name in shipped}
    assert not found, "tsc against @grafana/schema failed:\n" + "\n".join(sum(found.values(), []))


@pytest.mark.parametrize("name", MISTAKES)
def test_schema_check_rejects_a_broken_dashboard(tsc_errors, name):
    expected = MISTAKES[name][1]
    lines = tsc_errors.get(f"broken-{name}.ts", [])
    assert lines and any(expected in line for line in lines), (name, lines)


# -- uids, ids, units, data sources -----------------------------------------------------------
def test_there_is_a_dashboard_and_its_uids_are_fixed_and_unique():
    assert DASHBOARDS, "no dashboard in grafana/dashboards"
    uids = [load(p).get("uid") for p in DASHBOARDS]
    assert all(uid and re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", uid) for uid in uids), uids
    assert len(set(uids)) == len(uids), f"duplicate dashboard uids: {uids}"
    titles = [load(p)["title"] for p in DASHBOARDS]
    assert len(set(titles)) == len(titles)


def test_datasource_uids_are_fixed_unique_and_what_the_dashboards_default_to():
    datasources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    uids = [d.get("uid") for d in datasources]
    assert all(uids) and len(set(uids)) == len(uids), uids
    prometheus = [d for d in datasources if d["type"] == "prometheus"]
    assert len(prometheus) == 1
    for path in DASHBOARDS:
        variables = {v["name"]: v for v in load(path)["templating"]["list"]}
        assert variables["datasource"]["current"]["value"] == prometheus[0]["uid"], path.name


def test_every_query_goes_through_the_datasource_variable():
    for path in DASHBOARDS:
        dashboard = load(path)
        for panel in panels(dashboard):
            refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
            if panel["type"] != "row":
                assert all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), panel["title"]
        for annotation in dashboard["annotations"]["list"]:
            if annotation.get("builtIn"):
                continue
            assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, annotation["name"]


def test_panel_ids_and_query_ref_ids_are_unique():
    for path in DASHBOARDS:
        ids = [p["id"] for p in panels(load(path))]
        assert len(set(ids)) == len(ids), f"{path.name}: duplicate panel ids {ids}"
        for panel in panels(load(path)):
            refs = [t["refId"] for t in panel.get("targets", [])]
            assert len(set(refs)) == len(refs), panel["title"]


def test_every_panel_sets_a_unit():
    for path in DASHBOARDS:
        for panel in panels(load(path)):
            if panel["type"] != "row":
                assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"


def test_panels_do_not_overlap():
    for path in DASHBOARDS:
        taken: dict[tuple[int, int], str] = {}
        for panel in panels(load(path)):
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, panel["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                    taken[(x, y)] = panel["title"]


# -- the queries name series that exist --------------------------------------------------------
def known_series() -> set[str]:
    """Series the exporter and the webhook define, and the recording rules' records."""
    names: set[str] = set()
    for source in [*(REPO / "exporter").glob("*.py"), *(REPO / "webhook").glob("*.py")]:
        for name in re.findall(r"[\"'](hangwatch_[a-z_]+)[\"']", source.read_text()):
            names.add(name)
            names.add(name + "_total")  # counters: prometheus_client appends _total
    for rules in (RECORDING_RULES, REPO / "rules" / "hangwatch-fleet.yml"):
        names |= set(re.findall(r"record:\s*(\S+)", rules.read_text()))
    return names | {"ALERTS", "up"}


def test_every_series_a_query_names_exists():
    known = known_series()
    functions = {"max", "min", "sum", "rate", "increase", "by", "without", "or", "and", "unless", "offset", "topk", "time",
                 "count", "avg", "label_values", "on", "ignoring", "group_left", "group_right"}
    for path in DASHBOARDS:
        for where, expr in queries(load(path)):
            stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|offset\s+\w+|\b\d\w*", " ", expr)
            for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped):
                if name in functions or name.startswith("__"):
                    continue
                assert name in known or name in ("alertname", "target", "kind", "action", "reason", "state", "result",
                                                 "signature"), \
                    f"{path.name} {where}: {name} is no series the exporter, webhook or rules define"


def test_the_state_panel_reads_the_recording_rule_the_alerts_read():
    alerts = (REPO / "rules" / "hangwatch-alerts.yml").read_text()
    assert "target:hangwatch_backend_state:current" in alerts
    for path in DASHBOARDS:
        state = [p for p in panels(load(path)) if p["type"] == "state-timeline" and "state" in p["title"].lower()]
        assert state, f"{path.name}: no state timeline"
        for panel in state:
            expr = panel["targets"][0]["expr"]
            assert "target:hangwatch_backend_state:current" in expr
            states = set(re.findall(r'state="(\w+)"', expr))
            assert states == {"idle", "busy", "hung", "stalled", "restarted", "blind", "down"}, states
            mapped = {v["text"] for m in panel["fieldConfig"]["defaults"]["mappings"] for v in m["options"].values()}
            assert mapped == states


def test_provisioning_points_at_the_mounted_dashboards():
    provider = yaml.safe_load(PROVIDERS.read_text())["providers"][0]
    assert provider["type"] == "file"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.startswith("./grafana/dashboards:") and m.split(":")[1] == provider["options"]["path"]
               for m in mounts), mounts


# -- variables and links: a fleet across namespaces, models and clusters -------------------------
def variables() -> dict[str, dict]:
    return {v["name"]: v for v in load(GRAFANA / "dashboards" / "hangwatch.json")["templating"]["list"]}


def test_the_backend_variable_is_narrowed_by_cluster_namespace_and_model_in_that_order():
    found = variables()
    assert list(found) == ["datasource", "cluster", "namespace", "model", "target"]
    known = known_series()
    for index, name in enumerate(["cluster", "namespace", "model", "target"]):
        query = found[name]["query"]["query"]
        for earlier in ["cluster", "namespace", "model"][:index]:
            assert f"=~\"${earlier}\"" in query, (name, earlier)  # chained: a later list follows the earlier choice
        assert {m for m in re.findall(r"(hangwatch_\w+)", query)} <= known, name
        assert found[name]["includeAll"] and found[name]["multi"]
    # All backends is the listed ones: a bare ".*" would show every backend whatever was chosen above.
    assert "allValue" not in found["target"]
    assert found["target"]["regex"] == '/target="([^"]+)"/' and found["target"]["query"]["qryType"] == 3


def test_the_backend_query_keeps_backends_serving_the_model_or_listing_none(tmp_path):
    """The target variable's PromQL, run by promtool: a backend serving the chosen model stays, one
    serving only others goes, one that lists no models (FastChat's proxy, a blind server) stays."""
    promtool = require_binary("promtool")
    query = variables()["target"]["query"]["query"]
    expr = query[len("query_result("):-1]
    series = [
        {"series": 'hangwatch_up{target="a", namespace="llm", cluster="c1"}', "values": "1"},
        {"series": 'hangwatch_up{target="b", namespace="llm", cluster="c1"}', "values": "1"},
        {"series": 'hangwatch_up{target="c", namespace="llm", cluster="c1"}', "values": "1"},
        {"series": 'hangwatch_up{target="d", namespace="other", cluster="c1"}', "values": "1"},
        {"series": 'hangwatch_model_served{target="a", model="m1"}', "values": "1"},
        {"series": 'hangwatch_model_served{target="b", model="m2"}', "values": "1"},
        {"series": 'hangwatch_model_served{target="d", model="m1"}', "values": "1"},
    ]

    def case(cluster, namespace, model, targets):
        filled = expr.replace("$cluster", cluster).replace("$namespace", namespace).replace("$model", model)
        return {"expr": f"sum by (target) ({filled})", "eval_time": "0m",
                "exp_samples": [{"labels": f'{{target="{t}"}}', "value": 1} for t in targets]}
    tests = {"rule_files": [], "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
        case(".*", ".*", "m1", ["a", "c", "d"]),
        case(".*", "llm", "m1", ["a", "c"]),
        case(".*", "llm", ".*", ["a", "b", "c"]),
        case("c2", ".*", ".*", []),
    ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_links_to_vllms_own_dashboards_with_its_choices():
    link, = load(GRAFANA / "dashboards" / "hangwatch.json")["links"]
    assert link["type"] == "dashboards" and link["tags"] == ["vllm"]
    assert link["includeVars"] and link["keepTime"]  # the same namespace, model and backend; the same time


def test_the_restart_annotation_names_that_restarts_signature_never_an_older_one(tmp_path):
    """The restart annotation joins the webhook's last-restart series for its signature (issue 25):
    evaluated with promtool over a restart whose new series is scraped one scrape after the
    restart counter moved, it names no signature at that step (never the previous restart's),
    then this restart's."""
    promtool = require_binary("promtool")
    (annotation,) = [a for a in load(GRAFANA / "dashboards" / "hangwatch.json")["annotations"]["list"]
                     if a["name"] == "hangwatch restart"]
    assert "{{signature}}" in annotation["textFormat"]
    expr = f"count by (target, result, signature) ({annotation['target']['expr']})"
    webhook = 'job="hangwatch_webhook", instance="webhook:9878"'
    rules = tmp_path / "none.yml"
    rules.write_text("groups: []\n")
    document = {"rule_files": [str(rules)], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            {"series": f'hangwatch_webhook_restarts_total{{{webhook}, target="vllm-a", result="ok"}}',
             "values": "0x26 1x11"},                        # restarted: counted from 405 s
            {"series": f'hangwatch_webhook_last_restart_timestamp_seconds{{{webhook}, target="vllm-a", '
                       f'signature="process_stopped"}}', "values": "10x26 stale"},  # the restart before: stale at 405 s
            {"series": f'hangwatch_webhook_last_restart_timestamp_seconds{{{webhook}, target="vllm-a", '
                       f'signature="engine_step_stuck"}}', "values": "_ _x27 400x9"},  # scraped from 420 s
            {"series": f'hangwatch_webhook_restarts_total{{{webhook}, target="vllm-b", result="ok"}}',
             "values": "0x37"}],
        "promql_expr_test": [
            {"expr": expr, "eval_time": "405s", "exp_samples": [{"labels": '{result="ok", target="vllm-a"}',
                                                                 "value": 1}]},
            {"expr": expr, "eval_time": "435s", "exp_samples": [
                {"labels": '{result="ok", signature="engine_step_stuck", target="vllm-a"}', "value": 1}]},
        ]}]}
    path = tmp_path / "annotation.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
