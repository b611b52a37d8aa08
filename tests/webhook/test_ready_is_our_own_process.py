"""A helper server is ready when ITS OWN process answers (issue 33): a port picked free and handed
over can be taken before the server binds it, and whoever took it then answers for it.

Each test puts a squatter, answering 200 to everything, on the port the helper would be given
first: the helper must not take the squatter's answer for its own readiness.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from hangwatch.demo.files import private_file
from hangwatch.demo.processes import listening_ports
from harness.ports import free_port

from . import real_parts, sshd
from .real_parts import WebhookProcess


class Squatter:
    """An HTTP server on a loopback port of its own, answering 200 "squatter" to every GET."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "8")
                self.end_headers()
                self.wfile.write(b"squatter")

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def squatter():
    squatter = Squatter()
    yield squatter
    squatter.close()


def squatted_first(monkeypatch, module, squatter: Squatter) -> None:
    """``module.free_port`` gives the squatter's port first, then free ones."""
    ports = iter([squatter.port])
    monkeypatch.setattr(module, "free_port", lambda: next(ports, None) or free_port())


def test_the_webhook_process_is_ready_when_it_answers_itself(tmp_path, monkeypatch, squatter):
    squatted_first(monkeypatch, real_parts, squatter)
    token = private_file(tmp_path / "token", "proc-token-0123456789-0123456789-abc\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}]}))
    webhook = WebhookProcess(config, tmp_path / "webhook.log", "--dry-run")
    try:
        assert webhook.port != squatter.port and webhook.port in listening_ports(webhook.process.pid)
        assert requests.get(webhook.url + "/healthz", timeout=5).json()["dry_run"] is True
    finally:
        webhook.stop()


@pytest.mark.real
def test_a_fake_backend_container_is_ready_when_it_answers_itself(tmp_path, monkeypatch, squatter,
                                                                   docker_client, backend_image):
    squatted_first(monkeypatch, real_parts, squatter)
    backend = real_parts.Backend(docker_client, backend_image, tmp_path / "backends")
    try:
        backend.container.reload()
        assert backend.container.status == "running", backend.logs()
        assert backend.port != squatter.port
        assert "vllm:num_requests_running" in requests.get(backend.url + "/metrics", timeout=5).text
    finally:
        backend.remove()


@pytest.mark.real
def test_sshd_given_a_port_taken_meanwhile_starts_on_another(monkeypatch, squatter):
    squatted_first(monkeypatch, sshd, squatter)
    server = sshd.SSHServer()
    try:
        assert server.port != squatter.port and server.port in listening_ports(server.process.pid)
    finally:
        server.close()
