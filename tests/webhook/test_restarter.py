"""``DockerRestarter`` (the real Docker SDK) against a small fake Docker API on loopback.

The fake answers the calls the webhook is meant to make and records every request, so the
tests see exactly what goes over the wire: what the compose file's socket proxy must let
through (tests/test_compose.py checks its allowlist against ``recorded_engine_calls()``),
that a container is found by its exact name and then addressed by ID, and how dockerd
failures surface. The same restarter against a real dockerd is in test_real_docker.py.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import docker
import pytest

from hangwatch.webhook.restarter import ContainerNotFound, DockerError, DockerRestarter, container_from_inspect

CID = "7a" * 32
OTHER = "b0" * 32


class FakeDockerd:
    """Enough of the Docker API for DockerRestarter: /version, list, inspect, logs, restart."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict]] = []
        self.containers = {CID: {"Id": CID, "Name": "/vllm-a", "Config": {"Tty": True},
                                 "State": {"Status": "running", "Running": True, "Paused": False, "Restarting": False,
                                           "StartedAt": "2026-11-30T03:00:00.123456789Z"}},
                           OTHER: {"Id": OTHER, "Name": "/postgres", "Config": {"Tty": True},
                                   "State": {"Status": "running", "Running": True, "StartedAt": "2026-11-30T01:00:00Z"}}}
        dockerd = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                dockerd.handle(self, "GET")

            def do_POST(self):
                dockerd.handle(self, "POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"tcp://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, request, method):
        parts = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.calls.append((method, parts.path, query))
        path = re.sub(r"^/v1\.\d+", "", parts.path)
        if path == "/version":
            return self.reply(request, {"ApiVersion": "1.41", "Version": "20.10.24", "MinAPIVersion": "1.12"})
        if path == "/containers/json":
            pattern = json.loads(query.get("filters", "{}")).get("name", [""])[0]
            listed = [{"Id": c["Id"], "Names": [c["Name"]]} for c in self.containers.values()
                      if re.search(pattern, c["Name"])]
            return self.reply(request, listed)
        match = re.fullmatch(r"/containers/([^/]+)/(json|logs|restart)", path)
        # Like Docker: a name, an ID, or an ID prefix all address a container.
        found = match and next((c for c in self.containers.values() if c["Name"] == "/" + match.group(1)
                                or c["Id"].startswith(match.group(1))), None)
        if not found:
            return self.reply(request, {"message": "No such container"}, 404)
        if match.group(2) == "json":
            return self.reply(request, found)
        if match.group(2) == "logs":
            body = "".join(f"2026-11-30T03:00:0{i}Z line {i}\n" for i in range(5)).encode()
            return self.reply(request, body, content_type="application/octet-stream")
        found["State"]["StartedAt"] = "2026-11-30T04:00:00Z"
        request.send_response(204)
        request.end_headers()

    def reply(self, request, body, code=200, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request.send_response(code)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dockerd():
    fake = FakeDockerd()
    yield fake
    fake.close()


def restarter_for(dockerd: FakeDockerd) -> DockerRestarter:
    return DockerRestarter(docker.DockerClient(base_url=dockerd.url, version="auto", timeout=5))


def recorded_engine_calls() -> list[tuple[str, str]]:
    """(method, path) of every Docker API request one find/log tail/restart makes."""
    fake = FakeDockerd()
    try:
        restarter = restarter_for(fake)
        container = restarter.find("vllm-a")
        restarter.log_tail(container, 100)
        restarter.restart(container, 30)
        return [(method, path) for method, path, _ in fake.calls]
    finally:
        fake.close()


def test_find_uses_the_exact_name_then_the_id(dockerd):
    container = restarter_for(dockerd).find("vllm-a")
    assert (container.id, container.name, container.status, container.running) == (CID, "vllm-a", "running", True)
    assert container.started_at.isoformat() == "2026-11-30T03:00:00.123456+00:00"
    listing = next(q for m, p, q in dockerd.calls if p.endswith("/containers/json"))
    assert listing["all"] in ("1", "True", "true") and json.loads(listing["filters"]) == {"name": ["^/vllm-a$"]}
    assert any(p.endswith(f"/containers/{CID}/json") for _, p, _ in dockerd.calls)
    assert not any(p.endswith("/containers/vllm-a/json") for _, p, _ in dockerd.calls)


def test_a_name_that_is_only_an_id_prefix_is_not_found(dockerd):
    """Docker would resolve /containers/b0b0/json to postgres (an ID prefix): never restart that."""
    with pytest.raises(ContainerNotFound):
        restarter_for(dockerd).find(OTHER[:12])
    with pytest.raises(ContainerNotFound):
        restarter_for(dockerd).find("vllm")  # a prefix of a name is no name either


def test_restart_sends_the_stop_timeout_and_addresses_the_id(dockerd):
    restarter = restarter_for(dockerd)
    restarter.restart(restarter.find("vllm-a"), 7.2)
    method, path, query = dockerd.calls[-1]
    assert (method, path.split("/", 2)[2], query) == ("POST", f"containers/{CID}/restart", {"t": "8"})


def test_log_tail(dockerd):
    restarter = restarter_for(dockerd)
    lines = restarter.log_tail(restarter.find("vllm-a"), 3)
    assert lines == ["2026-11-30T03:00:02Z line 2", "2026-11-30T03:00:03Z line 3", "2026-11-30T03:00:04Z line 4"]
    query = next(q for _, p, q in dockerd.calls if p.endswith("/logs"))
    assert (query["tail"], query["timestamps"], query["stdout"], query["stderr"]) == ("3", "1", "1", "1")


def test_docker_unreachable_or_failing_is_a_docker_error(tmp_path):
    restarter = DockerRestarter(docker.DockerClient(base_url=f"unix://{tmp_path}/none.sock", version="1.41",
                                                    timeout=2))
    with pytest.raises(DockerError, match="ConnectionError"):
        restarter.find("vllm-a")


def test_inspect_answers_become_containers():
    never = container_from_inspect({"Id": "x", "Name": "/a", "State": {"Status": "created",
                                                                       "StartedAt": "0001-01-01T00:00:00Z"}})
    assert never.started_at is None and not never.running and never.status == "created"
    odd = container_from_inspect({"Id": "x", "Name": "/a", "State": {"Running": True, "StartedAt": "yesterday"}})
    assert odd.started_at is None and odd.running and odd.started_at_text == "yesterday"
    assert container_from_inspect({}).status == "unknown"


def test_a_configured_host_gets_its_own_client_that_ignores_requests_environment(dockerd, monkeypatch):
    """A docker_hosts host is reached as the config says, whatever the environment says:
    before, a proxy (or REQUESTS_CA_BUNDLE, for a TLS host) from the environment was used."""
    from hangwatch.webhook.config import parse_config
    from hangwatch.webhook.restarter import docker_restarters
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    config = parse_config({"docker_hosts": {"fake": {"url": dockerd.url, "insecure_tcp": True}}, "targets": [
        {"name": "a", "container": "vllm-a", "url": "http://127.0.0.1:1", "docker_host": "fake"},
        {"name": "b", "container": "vllm-a", "url": "http://127.0.0.1:2"}]})
    restarters = docker_restarters(config)
    assert sorted(restarters) == ["default", "fake"]
    container = restarters["fake"].find("vllm-a")
    assert container.id == CID
    assert dockerd.calls[0][:2] == ("GET", "/version")  # the API version, asked once, unversioned
    assert any(p == f"/v1.41/containers/{CID}/json" for _, p, _ in dockerd.calls)


def test_a_host_that_is_down_is_a_docker_error_naming_it_and_is_tried_again(dockerd):
    from hangwatch.webhook.hosts import DockerHost
    restarter = DockerRestarter(host=DockerHost("gpu-9", "tcp://127.0.0.1:9"), timeout=2)
    with pytest.raises(DockerError, match="docker host gpu-9: ConnectionError"):
        restarter.find("vllm-a")
    restarter._host = DockerHost("gpu-9", dockerd.url)  # it came back (same restarter, no client kept)
    assert restarter.find("vllm-a").id == CID
