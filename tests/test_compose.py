"""The compose stack: valid for docker-compose, safe by construction, and in step with the
examples, the rules, the webhook's config and the dashboard.

The images cannot be pulled here, so the stack itself is not started: docker-compose
validates the file (``config -q``), promtool and amtool validate the Prometheus and
Alertmanager configs, and hangwatch's own loaders validate the exporter and webhook configs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hangwatch.exporter.config import load_exporter_config
from hangwatch.webhook.config import load_config as load_webhook_config
from tests.support.require import require_binary

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROFILES = ([], ["--profile", "gpu"], ["--profile", "sim"])
EXISTING = ["-f", str(REPO / "docker-compose.yml"), "-f", str(REPO / "docker-compose.existing.yml")]
HEALTHCHECK = "/usr/local/lib/hangwatch/healthcheck.py"   # where the Dockerfile puts deploy/healthcheck.py


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def services() -> dict:
    return compose()["services"]


def resolved(profile: list[str], files: list[str] | None = None, env: dict | None = None) -> dict:
    """The file as docker-compose resolves it (anchors merged, profile applied, overrides merged)."""
    docker_compose = require_binary("docker-compose")
    files = files or ["-f", str(REPO / "docker-compose.yml")]
    done = subprocess.run([docker_compose, *files, *profile, "config"], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


# -- docker-compose accepts it -----------------------------------------------------------------
@pytest.mark.parametrize("profile", PROFILES, ids=["default", "gpu", "sim"])
def test_docker_compose_config_is_valid(profile):
    docker_compose = require_binary("docker-compose")
    done = subprocess.run([docker_compose, "-f", str(REPO / "docker-compose.yml"), *profile, "config", "-q"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr


def active(profile: str) -> dict:
    """The services ``docker compose --profile PROFILE up`` starts (docker-compose 1.29's
    ``config`` lists every service whatever the profile, so profiles are applied here)."""
    return {name: s for name, s in resolved(["--profile", profile])["services"].items()
            if not s.get("profiles") or profile in s["profiles"]}


def test_the_sim_profile_swaps_vllm_for_the_simulator_under_the_same_names():
    gpu, sim = active("gpu"), active("sim")
    assert "vllm" in gpu and "vllm-sim" not in gpu
    assert "vllm-sim" in sim and "vllm" not in sim
    for service in (gpu["vllm"], sim["vllm-sim"]):
        assert service["container_name"] == "hangwatch-vllm"
        assert service["networks"]["hangwatch"]["aliases"] == ["vllm"]
    assert gpu["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert gpu["vllm"]["image"].startswith("vllm/vllm-openai:")
    common = {"exporter", "prometheus", "alertmanager", "webhook", "docker-proxy", "grafana"}
    assert set(gpu) == common | {"vllm"} and set(sim) == common | {"vllm-sim"}


# -- safety ------------------------------------------------------------------------------------
def test_only_the_socket_proxy_gets_the_docker_socket_and_read_only():
    for name, service in services().items():
        mounts = [str(v) for v in service.get("volumes", [])]
        socket_mounts = [m for m in mounts if "docker.sock" in m]
        assert bool(socket_mounts) == (name == "docker-proxy"), name
        assert all(m.endswith(":ro") for m in socket_mounts), socket_mounts
        assert not service.get("privileged"), name
    assert not any("docker.sock" in str(v) for v in services()["webhook"].get("volumes", []))


def test_the_webhook_reaches_docker_only_through_the_proxy_on_a_private_network():
    data = resolved([])
    webhook, proxy = data["services"]["webhook"], data["services"]["docker-proxy"]
    assert webhook["environment"]["DOCKER_HOST"] == "tcp://docker-proxy:2375"
    assert "-proxyport=2375" in proxy["command"] and "-listenip=0.0.0.0" in proxy["command"]
    assert "-allowfrom=webhook" in proxy["command"], "only the webhook may use the proxy"
    assert set(proxy["networks"]) == {"docker-api"}
    assert set(webhook["networks"]) == {"hangwatch", "docker-api"}
    assert data["networks"]["docker-api"].get("internal") is True
    users = [name for name, s in data["services"].items() if "docker-api" in s.get("networks", {})]
    assert sorted(users) == ["docker-proxy", "webhook"]
    assert "depends_on" in webhook and "docker-proxy" in webhook["depends_on"]
    assert "ports" not in proxy
    assert proxy["read_only"] is True and proxy["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in proxy["security_opt"]
    assert proxy["image"].startswith("wollomatic/socket-proxy:") and ":latest" not in proxy["image"]


def proxy_allowlist() -> dict[str, re.Pattern]:
    """The proxy's per-method allowlist as it applies it: anchored, matched against the path."""
    allowed = {}
    for arg in services()["docker-proxy"]["command"]:
        match = re.fullmatch(r"-allow(GET|HEAD|POST|PUT|PATCH|DELETE|CONNECT|TRACE|OPTIONS)=(.*)", arg)
        if match:
            assert match.group(1) not in allowed, f"{match.group(1)} given twice"
            allowed[match.group(1)] = re.compile("^" + match.group(2) + "$")
    return allowed


def proxy_allows(method: str, path: str) -> bool:
    pattern = proxy_allowlist().get(method)
    return bool(pattern and pattern.match(path))


def test_the_proxy_allows_what_the_webhook_calls_and_nothing_that_could_take_the_host():
    from tests.webhook.test_restarter import recorded_engine_calls
    calls = recorded_engine_calls()
    assert {m for m, _ in calls} == {"GET", "POST"} and len(calls) >= 5
    for method, path in calls:
        assert proxy_allows(method, path), f"the proxy would refuse the webhook's {method} {path}"
    assert set(proxy_allowlist()) == {"GET", "POST"}
    cid = "3f" * 32
    for method, path in [
        ("POST", "/v1.41/containers/create"), ("POST", f"/v1.41/containers/{cid}/exec"),
        ("POST", f"/v1.41/containers/{cid}/kill"), ("POST", f"/v1.41/containers/{cid}/stop"),
        ("POST", f"/v1.41/containers/{cid}/start"), ("DELETE", f"/v1.41/containers/{cid}"),
        ("POST", f"/v1.41/containers/{cid}/update"), ("PUT", f"/v1.41/containers/{cid}/archive"),
        ("GET", f"/v1.41/containers/{cid}/archive"), ("GET", f"/v1.41/containers/{cid}/export"),
        ("HEAD", f"/v1.41/containers/{cid}/archive"), ("POST", "/v1.41/images/create"),
        ("GET", "/v1.41/images/json"), ("POST", "/v1.41/volumes/create"), ("POST", "/v1.41/build"),
        ("GET", "/v1.41/info"), ("GET", "/v1.41/events"), ("POST", "/v1.41/exec/abc/start"),
        ("GET", "/v1.41/secrets"), ("POST", "/v1.41/swarm/init"), ("POST", "/session"),
        ("POST", f"/v1.41/containers/{cid}/restart/../../create"), ("GET", "/v1.41/containers/../images/json"),
        ("POST", f"/v1.41/containers/{cid}/attach"), ("GET", f"/v1.41/containers/{cid}/attach/ws"),
    ]:
        assert not proxy_allows(method, path), f"the proxy lets through {method} {path}"


def test_the_token_comes_from_a_file_never_from_the_compose_file():
    data = compose()
    assert data["secrets"]["hangwatch-token"] == {"file": "./deploy/secrets/hangwatch-token"}
    for name, service in services().items():
        environment = json.dumps(service.get("environment", {})).lower()
        assert "token" not in environment or name == "vllm", f"{name}: a token in the environment"
    assert services()["webhook"]["secrets"] == ["hangwatch-token"]
    assert services()["alertmanager"]["secrets"] == ["hangwatch-token"]
    # The file is the webhook user's (0440, see deploy/README.md); Alertmanager reads it
    # through that group, so nobody else needs to.
    uid, gid = services()["webhook"]["user"].split(":")
    assert services()["alertmanager"]["group_add"] == [gid]
    assert load_webhook_config(str(DEPLOY / "webhook.yml")).token_file == "/run/secrets/hangwatch-token"
    alertmanager = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text())
    hook = next(r for r in alertmanager["receivers"] if r["name"] == "hangwatch-webhook")["webhook_configs"][0]
    assert hook["http_config"]["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/hangwatch-token"}
    ignored = (DEPLOY / "secrets" / ".gitignore").read_text().split()
    assert "*" in ignored


def test_exporter_and_webhook_are_reachable_on_the_compose_network_only():
    for name in ("exporter", "webhook", "docker-proxy"):
        assert "ports" not in services()[name], name
    for name, service in services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    exporter = load_exporter_config(str(DEPLOY / "exporter.yml"))
    assert exporter.allow_targets == ("http://vllm:8000",), "the exporter must not read arbitrary URLs"


def test_every_service_has_a_healthcheck_that_sends_no_inference_request():
    for name, service in services().items():
        check = service.get("healthcheck")
        assert check, f"{name}: no healthcheck"
        if check.get("disable"):
            assert name == "vllm", f"{name}: only vLLM may go without one (hangwatch judges it)"
            continue
        test = " ".join(check["test"])
        if name == "docker-proxy":  # its image's own check of the socket (no shell, no HTTP client)
            assert check["test"] == ["CMD", "./healthcheck"] and "-allowhealthcheck" in service["command"]
            continue
        assert not re.search(r"/v1/(chat/)?completions|/generate", test), f"{name}: {test}"
        if name in ("exporter", "webhook"):  # the image's own check: asks that server about itself
            assert check["test"] == ["CMD", "python", HEALTHCHECK], name
            continue
        assert "hangwatch check" in test or re.search(r"/metrics|/-/ready|/healthz|/api/health", test), test


def test_restart_policies_act_on_a_dead_process_only():
    for name, service in resolved(["--profile", "gpu", "--profile", "sim"])["services"].items():
        assert service.get("restart") in ("unless-stopped", "on-failure", "always"), name
        labels = json.dumps(service.get("labels", {}))
        assert "autoheal" not in labels and "autoheal" not in service.get("image", ""), name


def test_names_agree_across_compose_prometheus_and_webhook():
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "hangwatch")
    labels = job["static_configs"][0]["labels"]
    (target,) = load_webhook_config(str(DEPLOY / "webhook.yml")).targets
    assert labels == {"target": target.name, "container": target.container}
    assert services()["vllm"]["container_name"] == target.container
    assert job["static_configs"][0]["targets"] == [target.url]
    grace = services()["vllm"]["stop_grace_period"]
    assert float(grace.rstrip("s")) == target.stop_timeout


# -- the configs, checked by their own tools and kept in step with the examples -----------------
def _expected_rule_files() -> list[str]:
    return [f"/etc/prometheus/rules/{Path(p).name}"
            for p in yaml.safe_load((REPO / "examples" / "prometheus.yml").read_text())["rule_files"]]


def test_prometheus_config_is_valid_and_loads_the_shipped_rules(tmp_path):
    promtool = require_binary("promtool")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == _expected_rule_files()
    mounts = services()["prometheus"]["volumes"]
    assert "./rules:/etc/prometheus/rules:ro" in mounts
    for rule_file in config["rule_files"]:
        assert (REPO / "rules" / Path(rule_file).name).is_file(), rule_file
    config["rule_files"] = [str(REPO / "rules" / Path(p).name) for p in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_config_is_the_example_with_service_names():
    ours = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    example = yaml.safe_load((REPO / "examples" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in ours["scrape_configs"]}
    for job in example["scrape_configs"]:
        mine = jobs[job["job_name"]]
        for key in set(job) - {"static_configs", "relabel_configs"}:
            assert mine.get(key) == job[key], f"{job['job_name']}.{key}"
        strip = [{k: v for k, v in r.items() if k != "replacement"} for r in job.get("relabel_configs", [])]
        assert strip == [{k: v for k, v in r.items() if k != "replacement"} for r in mine.get("relabel_configs", [])]
    assert ours["global"] == example["global"]
    assert jobs["hangwatch_webhook"]["static_configs"] == [{"targets": ["webhook:9878"]}]


def test_alertmanager_config_is_valid_and_routes_as_the_example():
    amtool = require_binary("amtool")
    done = subprocess.run([amtool, "check-config", str(DEPLOY / "alertmanager.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ours = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text())
    example = yaml.safe_load((REPO / "examples" / "alertmanager.yml").read_text())
    assert ours["route"] == example["route"]
    theirs = {r["name"]: r for r in example["receivers"]}
    mine = {r["name"]: r for r in ours["receivers"]}
    assert set(mine) == set(theirs)
    hook, example_hook = (r["hangwatch-webhook"]["webhook_configs"][0] for r in (mine, theirs))
    assert hook["url"] == "http://webhook:9878/alerts"
    assert {k: v for k, v in hook.items() if k not in ("url", "http_config")} == \
        {k: v for k, v in example_hook.items() if k not in ("url", "http_config")}


def test_alertmanager_routes_the_restart_alert_to_the_webhook_and_every_alert_to_people():
    amtool = require_binary("amtool")

    def receiver(*labels):
        done = subprocess.run([amtool, "config", "routes", "test", f"--config.file={DEPLOY / 'alertmanager.yml'}",
                               *labels], capture_output=True, text=True, timeout=60)
        return done.stdout.strip()

    assert receiver("alertname=HangwatchBackendHung", "action=restart", "severity=critical",
                    "target=vllm", "container=hangwatch-vllm") == "hangwatch-webhook,people"
    assert receiver("alertname=HangwatchWebhookCircuitOpen", "severity=critical", "target=vllm") == "people"
    assert receiver("alertname=HangwatchBackendDown", "severity=warning", "target=vllm") == "people"


def test_webhook_and_exporter_configs_load_with_hangwatchs_own_loaders():
    config = load_webhook_config(str(DEPLOY / "webhook.yml"))
    assert not config.dry_run and config.alertnames == ("HangwatchBackendHung",)
    load_exporter_config(str(DEPLOY / "exporter.yml"))


@pytest.mark.parametrize("files", [None, EXISTING], ids=["stack", "existing-vllm"])
def test_the_mounted_files_exist(files):
    for name, service in resolved(["--profile", "gpu", "--profile", "sim"], files)["services"].items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith(str(REPO)):
                assert Path(source).exists(), f"{name}: {source}"


def test_grafana_runs_the_version_the_dashboard_is_checked_against():
    pinned = json.loads((REPO / "grafana" / "check" / "package.json").read_text())["devDependencies"]["@grafana/schema"]
    image = services()["grafana"]["image"]
    assert image == f"grafana/grafana:{pinned}", (image, pinned)


def test_the_image_holds_the_packages_the_services_run():
    dockerfile = (REPO / "Dockerfile").read_text()
    packages = re.search(r"packages\s*=\s*\[([^\]]*)\]", (REPO / "pyproject.toml").read_text()).group(1)
    for package in re.findall(r'"(\w+)"', packages):
        assert f"COPY {package} ./{package}" in dockerfile, package
        assert f"!{package}/" in (REPO / ".dockerignore").read_text(), package
    folders = re.findall(r'^"hangwatch[\w.]*"\s*=\s*"([\w/]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert "rules" in folders and "grafana/dashboards" in folders
    for folder in folders:  # every installed package's folder (package-dir), rules and dashboards too
        assert f"COPY {folder} ./{folder}" in dockerfile, folder
        assert f"!{folder}/" in (REPO / ".dockerignore").read_text(), folder
    user = re.search(r"^USER (\d+)", dockerfile, re.M)
    assert user, "the image runs unprivileged by default"
    assert services()["webhook"]["user"] == f"{user.group(1)}:{user.group(1)}", "the webhook runs as the image's user"
    assert re.search(r"install -d -o 10001 -g 10001 -m 0700 /var/lib/hangwatch", dockerfile), \
        "the state directory belongs to that user, so a fresh webhook-state volume does too"


# -- one source: examples/ --------------------------------------------------------------------
def test_deploy_configs_are_generated_from_the_examples():
    """deploy/prometheus.yml and deploy/alertmanager.yml are examples/ with compose names: a hand
    edit of either (or an example changed without regenerating) fails here."""
    import sys as _sys
    done = subprocess.run([_sys.executable, str(DEPLOY / "compose_configs.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_drift_check_catches_an_edited_copy(tmp_path, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("compose_configs", DEPLOY / "compose_configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "prometheus.yml").write_text((DEPLOY / "prometheus.yml").read_text().replace("10s", "12s"))
    (tmp_path / "alertmanager.yml").write_text((DEPLOY / "alertmanager.yml").read_text())
    monkeypatch.setattr(module, "DEPLOY", tmp_path)
    assert module.main(["--check"]) == 1


def test_sigterm_waits_long_enough_for_a_restart_under_way():
    from hangwatch.webhook.app import restart_bound
    grace = services()["webhook"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > restart_bound(load_webhook_config(str(DEPLOY / "webhook.yml")))


# -- the image ---------------------------------------------------------------------------------
def dockerfile_stages() -> dict[str, list[str]]:
    """Instruction lines (continuations joined) per stage name; the last stage is ``final``."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    stages, current = {"": []}, ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM \S+(?: AS (\w+))?$", line)
        if match:
            current = match.group(1) or "final"
            stages[current] = []
        stages[current].append(line)
    return stages


def test_the_base_image_is_pinned_by_tag_and_digest():
    stages = dockerfile_stages()
    (pin,) = [line for line in stages[""] if line.startswith("ARG PYTHON_IMAGE=")]
    assert re.fullmatch(r"ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", pin), pin
    assert stages["base"][0] == "FROM ${PYTHON_IMAGE} AS base"
    for name, lines in stages.items():
        if name not in ("", "base"):
            assert lines[0] in (f"FROM base AS {name}", "FROM base"), lines[0]
    assert "imagetools inspect" in (REPO / "Dockerfile").read_text(), "how to refresh the digest"


def test_a_code_change_does_not_reinstall_the_dependencies():
    """The dependencies' stage sees pyproject.toml only; the image copies that stage's venv in a
    layer of its own before the wheel built from the code (Docker's cache keys on the inputs)."""
    stages = dockerfile_stages()
    copies = [line for line in stages["deps"] if line.startswith("COPY")]
    assert copies == ["COPY pyproject.toml /tmp/pyproject.toml"]
    assert any("pip install -r /tmp/requirements.txt" in line for line in stages["deps"])
    assert any("pip wheel --no-deps" in line for line in stages["wheel"])
    final = stages["final"]
    deps_layer = final.index("COPY --from=deps /opt/hangwatch /opt/hangwatch")
    wheel_layer = final.index("COPY --from=wheel /wheels /wheels")
    assert deps_layer < wheel_layer
    assert "RUN /opt/hangwatch/bin/pip install --no-deps /wheels/*.whl && rm -rf /wheels" in final
    assert not any(line.startswith(("COPY hangwatch", "COPY exporter", "ADD")) for line in final[:deps_layer])


def test_the_dependencies_stage_installs_exactly_pyprojects_dependencies(tmp_path):
    (run,) = [line for line in dockerfile_stages()["deps"] if line.startswith("RUN python -c")]
    snippet = re.match(r"RUN python -c '([^']*)'", run).group(1)
    try:
        import tomllib  # noqa: F401  (the image's Python has it; 3.10 has pytest's tomli)
    except ImportError:
        snippet = snippet.replace("tomllib", "tomli")
    snippet = snippet.replace("/tmp/pyproject.toml", str(REPO / "pyproject.toml"))
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    listed = re.search(r"^dependencies = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.M | re.S).group(1)
    assert done.stdout.split("\n")[:-1] == re.findall(r'^\s*"([^"]+)"', listed, re.M)


def test_the_image_health_check_is_the_servers_own():
    final = dockerfile_stages()["final"]
    assert f"COPY deploy/healthcheck.py {HEALTHCHECK}" in final
    (check,) = [line for line in final if line.startswith("HEALTHCHECK")]
    assert check.endswith(f'CMD ["python", "{HEALTHCHECK}"]') and "--timeout=5s" in check
    assert "ENV PATH=/opt/hangwatch/bin:$PATH" in final, "python is the image's venv"


def test_the_build_context_holds_every_file_the_dockerfile_copies():
    allowed = (REPO / ".dockerignore").read_text().split()
    assert "*" in allowed, "the context is an allowlist"
    for lines in dockerfile_stages().values():
        for line in lines:
            if line.startswith("COPY") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert f"!{source}" in allowed or f"!{source}/" in allowed, source


def test_hangwatch_services_run_under_an_init():
    for name, service in resolved(["--profile", "sim"])["services"].items():
        if service.get("image", "").startswith("hangwatch:"):
            assert service.get("init") is True, name


# -- beside a vLLM that is already running (docker-compose.existing.yml) -----------------------
def test_the_existing_vllm_override_is_valid_with_and_without_an_api_key(tmp_path):
    docker_compose = require_binary("docker-compose")
    key = tmp_path / "vllm-api-key"
    key.write_text("sk-test\n")
    for env in ({}, {"VLLM_API_KEY_FILE": str(key)}):
        done = subprocess.run([docker_compose, *EXISTING, "config", "-q"], capture_output=True, text=True,
                              timeout=60, cwd=REPO, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
    assert resolved([], EXISTING, {"VLLM_API_KEY_FILE": str(key)})["secrets"]["vllm-api-key"]["file"] == str(key)


def test_the_existing_vllm_override_starts_no_vllm_and_reaches_it_through_the_host():
    data = resolved([], EXISTING)
    active = {name for name, s in data["services"].items() if not s.get("profiles")}
    assert active == {"exporter", "prometheus", "alertmanager", "webhook", "docker-proxy", "grafana"}
    assert data["secrets"]["vllm-api-key"]["file"] == "/dev/null", "nothing to create without --api-key"
    mounts = {name: [str(v) for v in s.get("volumes", [])] for name, s in data["services"].items()}
    for name, config in (("exporter", "exporter.yml"), ("webhook", "webhook.yml"), ("prometheus", "prometheus.yml")):
        service = data["services"][name]
        mine = [m for m in mounts[name] if m.endswith(f"/{config}:ro")]
        assert mine == [f"{DEPLOY}/existing/{config}:" + mine[0].split(":", 1)[1]], (name, mounts[name])
        if name != "prometheus":
            hosts = service["extra_hosts"]  # docker-compose 1.29 prints a mapping, compose v2 a list
            hosts = [f"{k}:{v}" for k, v in hosts.items()] if isinstance(hosts, dict) else hosts
            assert hosts == ["host.docker.internal:host-gateway"], name
            assert {s["source"] for s in service["secrets"]} >= {"vllm-api-key"}, name
    assert {s["source"] for s in data["services"]["webhook"]["secrets"]} == {"hangwatch-token", "vllm-api-key"}
    assert "ports" not in data["services"]["exporter"] and "ports" not in data["services"]["webhook"]


def test_the_existing_vllm_names_agree_across_prometheus_exporter_and_webhook():
    prometheus = yaml.safe_load((DEPLOY / "existing" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "hangwatch")
    (static,) = job["static_configs"]
    (target,) = load_webhook_config(str(DEPLOY / "existing" / "webhook.yml")).targets
    exporter = load_exporter_config(str(DEPLOY / "existing" / "exporter.yml"))
    assert static["labels"] == {"target": target.name, "container": target.container}
    assert static["targets"] == [target.url] == list(exporter.allow_targets)
    assert target.url.startswith("http://host.docker.internal:")
    grace = services()["webhook"]["stop_grace_period"]
    assert float(grace.rstrip("s")) > restart_bound_of(DEPLOY / "existing" / "webhook.yml")


def restart_bound_of(path: Path) -> float:
    from hangwatch.webhook.app import restart_bound
    return restart_bound(load_webhook_config(str(path)))


def test_the_existing_configs_take_the_api_key_where_the_override_mounts_it(tmp_path):
    """Uncommenting the api_key_file lines, as the guide says, gives both the mounted key."""
    key = tmp_path / "vllm-api-key"
    key.write_text("sk-test-key\n")
    key.chmod(0o440)  # as docker-compose.existing.yml says (the webhook refuses a key others may read)
    for name in ("exporter.yml", "webhook.yml"):
        text = (DEPLOY / "existing" / name).read_text()
        assert "# api_key_file: /run/secrets/vllm-api-key" in text, name
        enabled = re.sub(r"# (api_key_file: )/run/secrets/vllm-api-key", rf"\g<1>{key}", text)
        (tmp_path / name).write_text(enabled)
    assert load_exporter_config(str(tmp_path / "exporter.yml")).api_key == "sk-test-key"
    assert load_webhook_config(str(tmp_path / "webhook.yml")).targets[0].api_key == "sk-test-key"
