"""components/hangwatch-sidecar on the Deployments users already have, rendered by the pinned kubectl.

Three shapes, written for these tests from what the projects document (tests/data/kubernetes):
(a) production-stack's Helm chart output, through the post-renderer the docs give; (b) an llm-d
guide's decode Deployment (routing proxy on 8000 as a native sidecar, vLLM on 8200), with the
Component listed in an overlay of the guide; (c) deploy/kubernetes/vllm, the example. Each result
must pass Kubernetes' published schemas and the Prometheus Operator's CRD schemas, keep every
field of every original container except the two probes it replaces, ask the sidecar about
vLLM's own port, and leave the Deployments it does not watch untouched.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from hangwatch.exporter.config import exporter_config
from hangwatch.exporter.query import Asked, asked
from hangwatch.rules.render import Settings
from tests.support.kubectl import kustomize, pinned_kubectl
from tests.test_kubernetes_manifests import k8s_validate, operator_check  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
COMPONENTS = KUBE / "components"
DATA = ROOT / "tests" / "data" / "kubernetes"
SIDECAR_PORT = 9877
PROBES = ("livenessProbe", "readinessProbe")


def post_render(helm_output: str, env: dict | None = None) -> list[dict]:
    """The production-stack post-renderer, as helm runs it: manifests on stdin, result on stdout."""
    kubectl_dir = str(Path(pinned_kubectl()).parent)
    done = subprocess.run([str(COMPONENTS / "production-stack" / "post-render")], input=helm_output,
                          capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PATH": kubectl_dir + os.pathsep + os.environ["PATH"]} | (env or {}))
    assert done.returncode == 0, done.stderr
    assert not list(COMPONENTS.glob(".helm-output.*")), "the post-renderer left its work directory behind"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# shape -> (the objects before, the objects after, {watched Deployment: (container, vLLM's own port)})
@pytest.fixture(scope="module")
def shapes() -> dict:
    helm_output = (DATA / "production-stack" / "helm-output.yaml").read_text()
    return {
        "production-stack": (documents(DATA / "production-stack" / "helm-output.yaml"), post_render(helm_output),
                             {"vllm-llama3-deployment-vllm": ("vllm", 8000)}),
        "llm-d": (kustomize(DATA / "llm-d" / "decode-guide"), kustomize(DATA / "llm-d" / "with-hangwatch"),
                  {"pd-qwen3-decode": ("modelserver", 8200)}),
        "example": (documents(KUBE / "vllm" / "vllm.yaml"), kustomize(KUBE / "vllm"), {"vllm": ("vllm", 8000)}),
    }


SHAPES = ["production-stack", "llm-d", "example"]


def find(objects, kind, name=None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"].startswith(name))]


def one(objects, kind, name) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def containers(deployment: dict) -> dict[str, dict]:
    pod = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


def sidecar_config(objects):
    return exporter_config(yaml.safe_load(one(objects, "ConfigMap", "hangwatch-sidecar-")["data"]["exporter.yml"]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("version", ["1.29", "latest"])
def test_each_shape_passes_the_kubernetes_schemas_strictly(shapes, shape, version):
    kv = k8s_validate()
    version = kv.utils.latest_version() if version == "latest" else version
    _, after, _ = shapes[shape]
    built_in = [o for o in after if o["apiVersion"] != "monitoring.coreos.com/v1"]
    assert {"Deployment", "ConfigMap", "NetworkPolicy"} <= {o["kind"] for o in built_in}
    for obj in built_in:
        kv.validate(obj, version, strict=True)


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shapes_monitors_pass_the_operator_crd_schemas(shapes, shape, operator_check, tmp_path):
    _, after, _ = shapes[shape]
    objects = [o for o in after if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert "hangwatch-sidecar" in [o["metadata"]["name"] for o in find(objects, "PodMonitor")]
    runtime, types = operator_check(objects, tmp_path)
    assert runtime.returncode == 0, runtime.stdout + runtime.stderr
    assert types.returncode == 0, types.stdout + types.stderr


@pytest.mark.parametrize("shape", SHAPES)
def test_every_original_container_field_is_kept(shapes, shape):
    """Only the watched container's liveness and readiness probes change; the rest is as it was."""
    before, after, watched = shapes[shape]
    for original in find(before, "Deployment"):
        name = original["metadata"]["name"]
        patched = one(after, "Deployment", name)
        old, new = containers(original), containers(patched)
        assert set(new) == set(old) | ({"hangwatch"} if name in watched else set())
        for container_name, fields in old.items():
            expected = copy.deepcopy(fields)
            got = copy.deepcopy(new[container_name])
            if name in watched and container_name == watched[name][0]:
                for probe in PROBES:
                    expected.pop(probe, None)
                    got.pop(probe)
            assert got == expected, (name, container_name)
        if name not in watched:  # not selected: not touched at all
            assert patched["spec"] == original["spec"], name
        volumes = patched["spec"]["template"]["spec"].get("volumes", [])
        assert all(v in volumes for v in original["spec"]["template"]["spec"].get("volumes", [])), name


@pytest.mark.parametrize("shape", SHAPES)
def test_probes_ask_the_sidecar_about_vllms_own_port(shapes, shape):
    _, after, watched = shapes[shape]
    config = sidecar_config(after)
    namespaces = {o["metadata"]["namespace"] for o in after if o["kind"] != "Namespace"}
    assert len(namespaces) == 1, namespaces  # the ConfigMap beside the pods that mount it
    for name, (container_name, vllm_port) in watched.items():
        deployment = one(after, "Deployment", name)
        pod = deployment["spec"]["template"]["spec"]
        sidecar = containers(deployment)["hangwatch"]
        vllm = containers(deployment)[container_name]
        assert sidecar["restartPolicy"] == "Always" and sidecar["ports"] == [{"name": "hangwatch", "containerPort": SIDECAR_PORT}]
        configmap = one(after, "ConfigMap", "hangwatch-sidecar-")["metadata"]["name"]
        assert {"name": "hangwatch-config", "configMap": {"name": configmap}} in pod["volumes"]
        declared = [p["containerPort"] for p in vllm["ports"]]
        assert vllm_port in declared  # vLLM's own port: not the routing proxy's 8000 in llm-d
        for kind, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
            probe = vllm[kind]
            assert set(probe) - {"httpGet"} <= {"periodSeconds", "timeoutSeconds", "failureThreshold", "successThreshold"}
            assert urlsplit(probe["httpGet"]["path"]).path == path and probe["httpGet"]["port"] == SIDECAR_PORT
            read = asked(urlsplit(probe["httpGet"]["path"]).query, config)
            assert isinstance(read, Asked), read
            assert (read.target, read.module) == (f"http://127.0.0.1:{vllm_port}", "backend")
            assert probe["timeoutSeconds"] > config.liveness_budget
        assert deployment["spec"]["template"]["metadata"]["labels"]["hangwatch.dev/container"] == container_name


@pytest.mark.parametrize("shape", SHAPES)
def test_the_pod_monitor_scrapes_probe_and_the_sidecars_own_metrics_as_the_rules_expect(shapes, shape):
    _, after, watched = shapes[shape]
    config = sidecar_config(after)
    monitor = one(after, "PodMonitor", "hangwatch-sidecar")
    probe, metrics = monitor["spec"]["podMetricsEndpoints"]
    defaults = Settings()
    assert probe["path"] == "/probe" and all(config.allows(t) for t in probe["params"]["target"])
    assert probe["params"]["target"] == [f"http://127.0.0.1:{port}" for _, port in watched.values()]
    assert metrics["path"] == "/metrics"
    assert (probe["relabelings"][0], metrics["relabelings"][0]) == (
        {"targetLabel": "job", "replacement": defaults.job}, {"targetLabel": "job", "replacement": defaults.exporter_job})
    assert probe["interval"] == metrics["interval"] == "15s"
    for name in watched:
        labels = one(after, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        for expression in monitor["spec"]["selector"]["matchExpressions"]:
            assert expression["operator"] == "Exists" and expression["key"] in labels
        assert monitor["spec"]["selector"].get("matchLabels", {}).items() <= labels.items()
        assert monitor["metadata"]["namespace"] == one(after, "Deployment", name)["metadata"]["namespace"]


@pytest.mark.parametrize("shape", SHAPES)
def test_only_prometheus_pods_reach_the_sidecar_port_and_other_ports_only_by_opt_in(shapes, shape):
    _, after, watched = shapes[shape]
    policy = one(after, "NetworkPolicy", "hangwatch-sidecar")
    sidecar_rule, *others = policy["spec"]["ingress"]
    source, = sidecar_rule["from"]
    assert source["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]
    assert source["podSelector"]["matchExpressions"] == [  # Prometheus' pods, not every pod of its namespace
        {"key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus"]}]
    assert sidecar_rule["ports"] == [{"protocol": "TCP", "port": SIDECAR_PORT}]
    # The rule keeping the pod's other ports open is the opt-in hangwatch-open-ports: only the example
    # (a namespace with no other policy) takes it; the wrappers never reopen what other policies closed.
    assert len(others) == (1 if shape == "example" else 0), others
    for rule in others:
        assert "from" not in rule  # every other port as open as before the policy selected the pod
        tcp = [(p["port"], p.get("endPort", p["port"])) for p in rule["ports"] if p["protocol"] == "TCP"]
        assert not any(low <= SIDECAR_PORT <= high for low, high in tcp)
        covered = {port for low, high in tcp for port in (low, high)}
        assert {1, SIDECAR_PORT - 1, SIDECAR_PORT + 1, 65535} <= covered
    for name, (container_name, _) in watched.items():
        labels = one(after, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert all(e["key"] in labels for e in policy["spec"]["podSelector"]["matchExpressions"])


def test_the_sidecar_meets_pod_security_restricted(shapes):
    for _, after, watched in shapes.values():
        for name in watched:
            sidecar = containers(one(after, "Deployment", name))["hangwatch"]
            context = sidecar["securityContext"]
            assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
            assert context["seccompProfile"]["type"] == "RuntimeDefault" and context["readOnlyRootFilesystem"] is True


def test_listing_the_component_inside_the_guide_lets_the_guides_patch_retune_the_probes(tmp_path):
    """Why docs/kubernetes.md says: an overlay. A kustomization's own patches run after its
    Components, and the guide's patch sets timeouts (5 s, 2 s) under the sidecar's 9 s check."""
    guide = tmp_path / "guide"
    guide.mkdir()
    for path in (DATA / "llm-d" / "decode-guide").iterdir():
        (guide / path.name).write_text(path.read_text())
    kustomization = yaml.safe_load((guide / "kustomization.yaml").read_text())
    kustomization["resources"] = [os.path.relpath(DATA / "llm-d" / "base", guide)]
    kustomization["components"] = [os.path.relpath(DATA / "llm-d" / "components" / "nixl-ucx", guide),
                                   os.path.relpath(COMPONENTS / "llm-d-decode", guide)]
    (guide / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    vllm = containers(one(kustomize(guide), "Deployment", "pd-qwen3-decode"))["modelserver"]
    assert (vllm["livenessProbe"]["timeoutSeconds"], vllm["readinessProbe"]["timeoutSeconds"]) == (5, 2)


def test_hangwatch_rules_kubernetes_settings_drive_the_component_and_match_its_rules(tmp_path):
    """`hangwatch rules --kubernetes` writes the PrometheusRules and the settings; the Component's
    PodMonitor then carries their interval, jobs and release label, and the sidecar reads the port."""
    out = tmp_path / "hw"
    done = subprocess.run([sys.executable, "-m", "hangwatch", "rules", "--kubernetes", "--scrape-interval", "30s",
                           "--release", "kps", "--vllm-port", "8200", "--prometheus-namespace", "observability",
                           "--prometheus-pod-name", "kps-prometheus",
                           "--job", "vllm_hangwatch", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    deployment = documents(DATA / "llm-d" / "base" / "decode.yaml")[0]
    deployment["metadata"]["labels"]["hangwatch.dev/container"] = "modelserver"
    (tmp_path / "decode.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["hw/hangwatch-settings.yaml", "hw/hangwatch-rules.yaml", "decode.yaml"],
        "components": [os.path.relpath(COMPONENTS / "hangwatch-sidecar", tmp_path)]}))
    after = kustomize(tmp_path)
    monitor = one(after, "PodMonitor", "hangwatch-sidecar")
    probe, metrics = monitor["spec"]["podMetricsEndpoints"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert probe["interval"] == metrics["interval"] == "30s"
    assert probe["relabelings"][0]["replacement"] == "vllm_hangwatch"
    assert probe["params"]["target"] == ["http://127.0.0.1:8200"] and sidecar_config(after).allows("http://127.0.0.1:8200")
    policy = one(after, "NetworkPolicy", "hangwatch-sidecar")
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["observability"]
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["kps-prometheus"]
    rules = find(after, "PrometheusRule")
    assert len(rules) == 3 and all(r["metadata"]["labels"]["release"] == "kps" for r in rules)
    recording = one(after, "PrometheusRule", "hangwatch-recording")
    exprs = " ".join(r["expr"] for g in recording["spec"]["groups"] for r in g["rules"])
    assert 'job=~"vllm_hangwatch"' in exprs and 'job=~"hangwatch"' not in exprs


def test_the_rules_component_takes_the_release_label_from_the_settings(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DATA / "llm-d" / "decode-guide", tmp_path)],
        "components": [os.path.relpath(COMPONENTS / "llm-d-decode", tmp_path),
                       os.path.relpath(COMPONENTS / "hangwatch-rules", tmp_path)]}))
    (tmp_path / "kustomization.yaml").write_text("namespace: llm-d-pd\n" + (tmp_path / "kustomization.yaml").read_text())
    rules = find(kustomize(tmp_path), "PrometheusRule")
    assert sorted(r["metadata"]["name"] for r in rules) == ["hangwatch-alerts", "hangwatch-fleet", "hangwatch-recording"]
    assert {r["metadata"]["labels"]["release"] for r in rules} == {"kube-prometheus-stack"}
    assert {r["metadata"]["namespace"] for r in rules} == {"llm-d-pd"}


@pytest.mark.parametrize("args, message", [
    (["--kubernetes", "--release", "not a label"], "--release"),
    (["--release", "kps"], "only with --kubernetes"),
    (["--kubernetes", "--job", "a|b"], "--job"),
    (["--kubernetes", "--vllm-port", "9877"], "--vllm-port"),
])
def test_hangwatch_rules_kubernetes_refuses_bad_settings(tmp_path, args, message):
    done = subprocess.run([sys.executable, "-m", "hangwatch", "rules", *args, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 64 and message in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_the_documented_settings_are_the_ones_the_component_reads_and_hangwatch_rules_writes():
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    table = doc[doc.index('<a id="settings"></a>'):]
    table = table[table.index("| key |"):]
    table = table[:table.index("\n\n")]
    documented = set()
    for row in table.splitlines()[2:]:
        documented |= set(re.findall(r"`([a-z-]+)`", row.split("|")[1]))
    read = set(re.findall(r"fieldPath: data\.([a-z-]+)", (COMPONENTS / "hangwatch-sidecar" / "kustomization.yaml").read_text()))
    from hangwatch.rules.kubernetes import component_settings
    written = set(component_settings(Settings())["data"])
    assert documented == read == written
    for wrapper in ("production-stack", "llm-d-decode", "vllm"):
        assert set(documents(COMPONENTS / wrapper / "settings.yaml")[0]["data"]) == read, wrapper


def test_the_documented_opt_in_reopens_the_other_ports_and_nothing_else(tmp_path):
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "  components:\n    - ../components/vllm                   # or production-stack, llm-d-decode\n" \
           "    - ../components/hangwatch-open-ports" in doc
    (tmp_path / "kustomization.yaml").write_text(
        "namespace: llm-d-pd\n"
        + yaml.safe_dump({"resources": [os.path.relpath(DATA / "llm-d" / "decode-guide", tmp_path)],
                          "components": [os.path.relpath(COMPONENTS / "llm-d-decode", tmp_path),
                                         os.path.relpath(COMPONENTS / "hangwatch-open-ports", tmp_path)]}))
    policy = one(kustomize(tmp_path), "NetworkPolicy", "hangwatch-sidecar")
    rule, others = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": SIDECAR_PORT}] and "podSelector" in rule["from"][0]
    assert "from" not in others and SIDECAR_PORT not in {p["port"] for p in others["ports"]}


def test_the_post_renderer_takes_your_image_and_settings():
    helm_output = (DATA / "production-stack" / "helm-output.yaml").read_text()
    settings = documents(COMPONENTS / "production-stack" / "settings.yaml")[0]
    settings["data"]["release"] = "kube-prom-stack"
    with tempfile.TemporaryDirectory() as work:
        own = Path(work) / "hangwatch-settings.yaml"
        own.write_text(yaml.safe_dump(settings))
        after = post_render(helm_output, {"HANGWATCH_IMAGE": "registry.example:5000/ml/hangwatch:0.2.1",
                                          "HANGWATCH_SETTINGS": str(own)})
    sidecar = containers(one(after, "Deployment", "vllm-llama3-deployment-vllm"))["hangwatch"]
    assert sidecar["image"] == "registry.example:5000/ml/hangwatch:0.2.1"
    assert one(after, "PodMonitor", "hangwatch-sidecar")["metadata"]["labels"]["release"] == "kube-prom-stack"
