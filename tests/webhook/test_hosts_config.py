"""docker_hosts and docker_host: every Docker host named once, every mistake refused at start-up naming its key."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hangwatch.demo.files import private_file
from hangwatch.webhook import hosts as hosts_module
from hangwatch.webhook.config import ConfigError, load_config, parse_config
from hangwatch.webhook.limits import allowance

from .certs import make_certs

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def target(name, **extra):
    return {"name": name, "container": extra.pop("container", name), "url": "http://127.0.0.1:8000", **extra}


def config(targets, **top):
    return parse_config({"targets": targets, **top})


def error(raw) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    return str(caught.value)


def test_targets_name_declared_hosts_by_name_or_url_and_default_stays_the_local_socket(certs):
    parsed = config([target("a"), target("b", docker_host="gpu-2"), target("c", docker_host="tcp://127.0.0.1:2376"),
                     target("d", docker_host="unix:///run/other-docker.sock")],
                    docker_hosts={"gpu-2": {"url": "tcp://127.0.0.1:2376", "tls": certs.tls()},
                                  "unused": {"url": "unix:///run/unused.sock"}})
    a, b, c, d = parsed.targets
    assert (a.docker_host.name, a.docker_host.url) == ("default", None)
    assert b.docker_host is c.docker_host or b.docker_host == c.docker_host
    assert b.docker_host.tls.ca_file == str(certs.ca) and b.docker_host.tls.key_file == str(certs.client_key)
    assert (d.docker_host.name, d.docker_host.url, d.docker_host.tls) == (
        "unix:///run/other-docker.sock", "unix:///run/other-docker.sock", None)
    assert [h.name for h in parsed.hosts] == ["default", "gpu-2", "unix:///run/other-docker.sock"]
    assert "PRIVATE KEY" not in repr(parsed)  # file paths only, never their contents


def test_fifty_targets_on_ten_hosts_name_their_tls_files_once_per_host(certs):
    docker_hosts = {f"gpu-{h}": {"url": f"tcp://gpu-{h}.example:2376", "tls": certs.tls()} for h in range(10)}
    targets = [target(f"t{i}", container=f"vllm-{i // 10}", docker_host=f"gpu-{i % 10}", group=f"model-{i % 5}")
               for i in range(50)]
    parsed = config(targets, docker_hosts=docker_hosts)
    assert len(parsed.hosts) == 10 and len({t.container for t in parsed.targets}) == 5


def test_the_same_container_name_on_one_host_twice_is_refused_even_by_name_and_url():
    hosts = {"gpu-2": {"url": "tcp://gpu-2.example:2375", "insecure_tcp": True}}
    message = error({"docker_hosts": hosts, "targets": [target("a", container="vllm", docker_host="gpu-2"),
                                                        target("b", container="vllm",
                                                               docker_host="tcp://gpu-2.example:2375")]})
    assert message == "targets[1].container: 'vllm' on docker host 'gpu-2' is already used by targets[0]"


def test_the_default_docker_host_is_told_apart_by_docker_host(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user-docker.sock")
    message = error({"targets": [target("a", container="vllm"),
                                 target("b", container="vllm", docker_host="unix:///run/user-docker.sock")]})
    assert "targets[1].container: 'vllm'" in message


def _bad_pem(tmp_path):
    path = tmp_path / "not.pem"
    path.write_text("hello\n")
    return str(path)


BAD = {
    "unknown scheme": ({"url": "http://gpu-2:2375"}, "docker_hosts.gpu-2.url: 'http://gpu-2:2375': the scheme must be one of unix://, tcp://, ssh://"),
    "tcp without port": ({"url": "tcp://gpu-2"}, "docker_hosts.gpu-2.url: 'tcp://gpu-2' must name its port"),
    "tcp with user": ({"url": "tcp://me@gpu-2:2376"}, "a tcp:// Docker host takes no user"),
    "ssh with password": ({"url": "ssh://me:secret@gpu-2"}, "must not carry a password"),
    "unix relative": ({"url": "unix://var/run/docker.sock"}, "must be unix:///ABSOLUTE/PATH"),
    "path": ({"url": "tcp://gpu-2:2376/v1"}, "must not carry a path"),
    "no url": ({"tls": None}, "docker_hosts.gpu-2.url: required"),
    "unknown key": ({"url": "tcp://gpu-2:2376", "tsl": {}}, "docker_hosts.gpu-2.tsl: unknown key"),
    "tls on unix": ({"url": "unix:///run/d.sock", "tls": "CERTS"}, "docker_hosts.gpu-2.tls: only a tcp:// Docker host uses TLS"),
    "tls key missing": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "CA", "cert_file": "CERT"}},
                        "docker_hosts.gpu-2.tls.key_file: required"),
    "tls file missing": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "/nonexistent/ca.pem", "cert_file": "CERT",
                                                              "key_file": "KEY"}},
                         "docker_hosts.gpu-2.tls.ca_file: cannot read /nonexistent/ca.pem: No such file or directory"),
    "tls file a directory": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "CA", "cert_file": "DIR", "key_file": "KEY"}},
                             "docker_hosts.gpu-2.tls.cert_file: cannot read"),
    "tls not pem": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "NOTPEM", "cert_file": "CERT", "key_file": "KEY"}},
                    "docker_hosts.gpu-2.tls.ca_file: NOTPEM holds no PEM certificate"),
    "tls key for another certificate": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "CA", "cert_file": "CERT",
                                                                             "key_file": "OTHERKEY"}},
                                        "docker_hosts.gpu-2.tls.key_file: OTHERKEY does not match docker_hosts.gpu-2.tls.cert_file"),
    "a certificate as the key": ({"url": "tcp://gpu-2:2376", "tls": {"ca_file": "CA", "cert_file": "CERT",
                                                                      "key_file": "CERT"}},
                                 "docker_hosts.gpu-2.tls.key_file: CERT holds no PEM private key"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_docker_host_is_refused_naming_its_key(name, certs, tmp_path):
    entry, message = BAD[name]
    files = {"CA": str(certs.ca), "CERT": str(certs.client_cert), "KEY": str(certs.client_key),
             "OTHERKEY": str(certs.other_client_key), "NOTPEM": _bad_pem(tmp_path), "DIR": str(tmp_path)}
    entry = json.loads(json.dumps(entry))
    if entry.get("tls") == "CERTS":
        entry["tls"] = certs.tls()
    for key, value in (entry.get("tls") or {}).items():
        entry["tls"][key] = files.get(value, value)
    for placeholder, path in files.items():
        message = message.replace(f" {placeholder} ", f" {path} ")
    got = error({"docker_hosts": {"gpu-2": entry}, "targets": [target("a", docker_host="gpu-2")]})
    assert message in got, got


def test_a_bad_reference_or_host_name_is_refused():
    assert error({"targets": [target("a", docker_host="gpu-9")]}) == (
        "targets[0].docker_host: 'gpu-9' is not in docker_hosts (known: none declared) and not a URL "
        "(unix://, tcp://, ssh://)")
    assert "docker_hosts.default: 'default' is the Docker host of targets without docker_host" in error(
        {"docker_hosts": {"default": {"url": "unix:///run/d.sock"}}, "targets": [target("a")]})
    assert "docker_hosts.b: tcp://h:2375 is already docker_hosts.a" in error(
        {"docker_hosts": {"a": {"url": "tcp://h:2375"}, "b": {"url": "tcp://h:2375"}}, "targets": [target("a")]}
    ).replace(".url: ", ": ")
    assert "targets[0].docker_host: 'ftp://h:21': the scheme must be one of" in error(
        {"targets": [target("a", docker_host="ftp://h:21")]})
    assert "docker_hosts: expected a mapping" in error({"docker_hosts": [{"url": "tcp://h:1"}], "targets": [target("a")]})


def test_ssh_needs_the_sdks_ssh_transport_said_at_start_up(monkeypatch):
    monkeypatch.setattr(hosts_module, "ssh_transport_missing", lambda: "ssh:// needs the paramiko package (x)")
    assert error({"targets": [target("a", docker_host="ssh://hangwatch@gpu-3")]}) == (
        "targets[0].docker_host: ssh:// needs the paramiko package (x)")
    assert error({"docker_hosts": {"gpu-3": {"url": "ssh://hangwatch@gpu-3:2222"}}, "targets": [target("a")]}) == (
        "docker_hosts.gpu-3.url: ssh:// needs the paramiko package (x)")
    monkeypatch.setattr(hosts_module, "ssh_transport_missing", lambda: None)
    parsed = config([target("a", docker_host="ssh://hangwatch@gpu-3:2222")])
    assert parsed.targets[0].docker_host.url == "ssh://hangwatch@gpu-3:2222"


def test_a_target_named_ledger_is_refused_its_lock_would_be_the_ledgers():
    assert "targets[0].name: 'ledger' is reserved" in error({"targets": [target("ledger")]})


@pytest.mark.parametrize("value, message", [
    (0, "group_limit: expected a whole number from 1 to 1000 or a share"), ("0%", "group_limit: expected"),
    ("150%", "group_limit: expected"), ("half", "group_limit: expected"), (True, "group_limit: expected"),
    (1.5, "group_limit: expected")])
def test_bad_group_limit_is_refused(value, message):
    assert message in error({"group_limit": value, "targets": [target("a")]})


def test_limits_parse_and_shares_round_down_but_never_below_one():
    parsed = config([target("a", group="llama-70b")], group_limit="25 %", recovery="10m",
                    fleet_budget={"restarts": 4, "window": "30m"})
    assert (parsed.group_limit, parsed.recovery, parsed.fleet_budget.restarts, parsed.fleet_budget.window) == (
        "25%", 600, 4, 1800)
    assert parsed.targets[0].group == "llama-70b"
    assert [allowance("25%", n) for n in (1, 2, 4, 7, 8, 100)] == [1, 1, 1, 1, 2, 25]
    assert [allowance("100%", n) for n in (1, 3)] == [1, 3] and allowance(2, 10) == 2
    assert allowance("33.3%", 3) == 1 and allowance("50%", 6) == 3
    assert "targets[0].group: 'a b' must be" in error({"targets": [target("a", group="a b")]})
    assert "fleet_budget.restarts: expected a whole number" in error(
        {"fleet_budget": {"restarts": 0}, "targets": [target("a")]})


def test_the_fleet_example_loads_with_its_tls_files_replaced(certs, tmp_path, monkeypatch):
    monkeypatch.setattr(hosts_module, "ssh_transport_missing", lambda: None)
    text = (REPO / "examples" / "fleet" / "webhook.yml").read_text()
    for name, path in (("ca.pem", certs.ca), ("webhook-cert.pem", certs.client_cert),
                       ("webhook-key.pem", certs.client_key)):
        text = text.replace(f"/etc/hangwatch/docker/{name}", str(path))
    path = tmp_path / "webhook.yml"
    path.write_text(text)
    parsed = load_config(str(path))
    assert [h.name for h in parsed.hosts] == ["default", "gpu-2", "gpu-3", "gpu-4"]
    assert parsed.hosts[1].tls == parsed.hosts[2].tls and parsed.hosts[1].tls.ca_file == str(certs.ca)
    assert {t.group for t in parsed.targets} == {"qwen-1.5b", "fastchat-vicuna"}


def test_a_missing_tls_file_stops_the_webhook_before_it_binds(certs, tmp_path):
    token = private_file(tmp_path / "token", "t0ken" * 8)
    path = tmp_path / "webhook.yml"
    path.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"),
                                "docker_hosts": {"gpu-2": {"url": "tcp://127.0.0.1:2376", "tls": dict(
                                    certs.tls(), key_file=str(tmp_path / "gone.pem"))}},
                                "targets": [target("a", docker_host="gpu-2")]}))
    done = subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(path), "--listen",
                           "127.0.0.1:0"], capture_output=True, text=True, timeout=30, env=dict(os.environ))
    assert done.returncode == 64, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"hangwatch webhook: docker_hosts.gpu-2.tls.key_file: cannot read {tmp_path / 'gone.pem'}: "
        "No such file or directory")
