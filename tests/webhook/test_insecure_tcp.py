"""A Docker host reached over plain TCP is refused unless someone said so for it.

Before: a ``tcp://`` Docker host without TLS — in ``docker_hosts``, as a target's ``docker_host``,
or the default Docker host from ``DOCKER_HOST=tcp://`` — was accepted with a warning (or, for
``DOCKER_HOST``, silently), handing the Docker host to whoever could reach its port. Now the webhook
does not start (exit 64, naming the target's ``docker_host``) unless the target, or the declared
host, says ``insecure_tcp: true``; TLS (``tls`` or ``DOCKER_TLS_VERIFY``) needs nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from hangwatch.demo.files import private_file
from hangwatch.settings import ConfigError
from hangwatch.webhook.config import load_config, parse_config

from . import certs as certs_module
from .real_parts import REPO

NO_DOCKER_ENV = {}  # the default Docker host is the local socket


def target(name="a", **extra) -> dict:
    return {"name": name, "container": f"vllm-{name}", "url": "http://127.0.0.1:9", **extra}


def error(raw, env=NO_DOCKER_ENV) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, env)
    return str(caught.value)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return certs_module.make_certs(tmp_path_factory.mktemp("certs"))


def test_an_undeclared_plain_tcp_url_is_refused_unless_the_target_says_so():
    message = error({"targets": [target(docker_host="tcp://docker-proxy:2375")]})
    assert message.startswith("targets[0].docker_host: tcp://docker-proxy:2375 is plain TCP: whoever reaches "
                              "that port controls the Docker host; declare it in docker_hosts with tls, or say "
                              "insecure_tcp: true on this target"), message
    parsed = parse_config({"targets": [target(docker_host="tcp://docker-proxy:2375", insecure_tcp=True)]},
                          NO_DOCKER_ENV)
    assert parsed.targets[0].docker_host.url == "tcp://docker-proxy:2375"


def test_a_declared_plain_tcp_host_is_refused_unless_it_or_the_target_says_so():
    hosts = {"proxy": {"url": "tcp://docker-proxy:2375"}}
    message = error({"docker_hosts": hosts, "targets": [target(), target("b", docker_host="proxy")]})
    assert message.startswith("targets[1].docker_host: docker_hosts.proxy (tcp://docker-proxy:2375) is plain TCP"), \
        message
    assert "give docker_hosts.proxy tls, or say insecure_tcp: true there or on this target" in message
    parse_config({"docker_hosts": hosts, "targets": [target(docker_host="proxy", insecure_tcp=True)]}, NO_DOCKER_ENV)
    said = {"proxy": {"url": "tcp://docker-proxy:2375", "insecure_tcp": True}}
    targets = [target(str(i), docker_host="proxy") for i in range(5)]  # said once, for every target on it
    assert len(parse_config({"docker_hosts": said, "targets": targets}, NO_DOCKER_ENV).targets) == 5


def test_a_declared_host_nobody_uses_is_never_connected_so_not_refused():
    parse_config({"docker_hosts": {"spare": {"url": "tcp://spare:2375"}}, "targets": [target()]}, NO_DOCKER_ENV)


def test_tls_needs_nothing_and_insecure_tcp_beside_it_is_a_mistake(certs):
    hosts = {"gpu-2": {"url": "tcp://gpu-2:2376", "tls": certs.tls()}}
    parse_config({"docker_hosts": hosts, "targets": [target(docker_host="gpu-2")]}, NO_DOCKER_ENV)
    message = error({"docker_hosts": {"gpu-2": {**hosts["gpu-2"], "insecure_tcp": True}}, "targets": [target()]})
    assert message == "docker_hosts.gpu-2.insecure_tcp: only for a plain tcp:// Docker host without tls (tcp://gpu-2:2376 has tls)"
    message = error({"docker_hosts": hosts, "targets": [target(docker_host="gpu-2", insecure_tcp=True)]})
    assert message == "targets[0].docker_host: insecure_tcp: true, but tcp://gpu-2:2376 is not plain tcp:// (remove it)"
    message = error({"docker_hosts": {"s": {"url": "unix:///run/d.sock", "insecure_tcp": True}}, "targets": [target()]})
    assert message.startswith("docker_hosts.s.insecure_tcp: only for a plain tcp:// Docker host")
    assert "targets[0].insecure_tcp: expected true or false" in error({"targets": [target(insecure_tcp="yes")]})


@pytest.mark.parametrize("env, refused", [
    ({"DOCKER_HOST": "tcp://docker-proxy:2375"}, True),
    ({"DOCKER_HOST": "tcp://docker-proxy:2375", "DOCKER_TLS_VERIFY": ""}, True),
    ({"DOCKER_HOST": "tcp://docker-proxy:2375", "DOCKER_CERT_PATH": "/certs"}, True),  # no verification: not TLS
    ({"DOCKER_HOST": "tcp://gpu-2:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": "/certs"}, False),
    ({"DOCKER_HOST": "unix:///run/docker.sock"}, False),
    ({"DOCKER_HOST": "ssh://me@gpu-3"}, False),
    ({}, False),
], ids=["tcp", "tls-verify-empty", "cert-path-only", "tls-verify", "unix", "ssh", "unset"])
def test_the_default_docker_host_from_docker_host_gets_the_same_rule(env, refused):
    raw = {"targets": [target()]}
    if not refused:
        parse_config(raw, env)
        return
    message = error(raw, env)
    assert message.startswith(f"targets[0].docker_host: the default Docker host, $DOCKER_HOST={env['DOCKER_HOST']}, is "
                              "plain TCP ($DOCKER_TLS_VERIFY is not set)"), message
    assert "or say insecure_tcp: true on this target" in message
    parse_config({"targets": [target(insecure_tcp=True)]}, env)


def test_the_process_environment_is_what_load_config_reads(tmp_path, monkeypatch):
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps({"targets": [target()]}))
    monkeypatch.setenv("DOCKER_HOST", "tcp://docker-proxy:2375")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    with pytest.raises(ConfigError, match=r"\$DOCKER_HOST=tcp://docker-proxy:2375"):
        load_config(str(path))


def test_plain_tcp_stops_the_webhook_exit_64_naming_the_key(tmp_path):
    token = private_file(tmp_path / "token", "proc-token-0123456789-0123456789-abc\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"),
                                  "targets": [target()]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    done = subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(config), "--listen",
                           "127.0.0.1:0"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**env, "DOCKER_HOST": "tcp://127.0.0.1:2375"})
    assert done.returncode == 64, done.stderr
    assert "hangwatch webhook: targets[0].docker_host: the default Docker host, $DOCKER_HOST=tcp://127.0.0.1:2375" \
        in done.stderr


@pytest.mark.parametrize("config", ["deploy/webhook.yml", "deploy/existing/webhook.yml"])
def test_the_compose_webhook_configs_load_with_the_docker_host_compose_sets(config):
    """The stack reaches Docker through docker-proxy over plain TCP on an internal network: its
    configs say insecure_tcp: true, and load with the environment docker-compose.yml gives."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["webhook"]["environment"]
    assert env["DOCKER_HOST"].startswith("tcp://") and "DOCKER_TLS_VERIFY" not in env
    loaded = load_config(str(REPO / config), env)
    assert loaded.targets and all(t.docker_host.url is None for t in loaded.targets)
    text = (REPO / config).read_text()
    assert text.count("insecure_tcp: true") == len(loaded.targets)
