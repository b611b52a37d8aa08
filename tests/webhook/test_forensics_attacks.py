"""Issue 35 on the webhook's side: a malicious forensics place (redirecting, dripping, behind a
proxy variable, naming a made-up signature), a backend that logs secrets and terminal escapes,
and a neighbour who swaps the state dir for a link after start-up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hangwatch.demo.files import private_file
from hangwatch.webhook.forensics import ask
from hangwatch.webhook.ledger import Ledger
from hangwatch.webhook.statedir import StateDirError, check_state_dir

from .conftest import Harness
from .fakes import FakeRestarter, payload

CAPTURE = {"verdict": "hung", "signature": "engine_step_stuck", "captured": True, "processes": [], "errors": []}
EVIL = {"verdict": "hung", "signature": "from_the_redirect", "captured": True, "processes": [], "errors": []}


@pytest.fixture
def http_server():
    servers = []

    def start(handler) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def answering(status: int, body: dict, headers: dict | None = None, drip: float | None = None):
    class Handler(BaseHTTPRequestHandler):
        seen: list = []

        def do_GET(self):
            Handler.seen.append((self.path, dict(self.headers)))
            data = json.dumps(body).encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) if drip is None else 10_000))
            self.end_headers()
            if drip is None:
                self.wfile.write(data)
                return
            try:
                for _ in range(10_000):  # a byte at a time: each read is quick, the whole never ends
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(drip)
            except OSError:
                pass

        def log_message(self, *args):
            pass
    return Handler


def test_a_redirect_is_not_followed(http_server):
    evil = http_server(answering(200, EVIL))
    place = http_server(answering(302, {}, {"Location": evil + "/forensics"}))
    answer = ask(place, "http://127.0.0.1:8000", 5)
    assert answer["signature"] is None and "redirect" in answer["errors"][0], answer


def test_a_dripping_server_cannot_stretch_the_deadline(http_server):
    place = http_server(answering(200, CAPTURE, drip=0.05))
    started = time.monotonic()
    answer = ask(place, "http://127.0.0.1:8000", 1.0)
    took = time.monotonic() - started
    assert took < 2.0 and answer["signature"] is None, (took, answer)
    assert "within 1s" in answer["errors"][0]


def test_no_proxy_is_taken_from_the_environment(http_server, monkeypatch):
    proxy = answering(200, EVIL)
    proxy_url = http_server(proxy)
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    monkeypatch.setenv("http_proxy", proxy_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    # The forensics place is unreachable: through a proxy the answer would be the proxy's.
    answer = ask("http://127.0.0.1:9", "http://127.0.0.1:8000", 3)
    assert proxy.seen == [] and answer["signature"] is None, answer


def test_a_signature_outside_the_table_is_invalid_and_the_token_and_container_are_sent(http_server):
    handler = answering(200, CAPTURE | {"signature": 'x"} evil{label="1'})
    place = http_server(handler)
    answer = ask(place, "http://127.0.0.1:8000", 5, token="forensics-token-0123456789abcdef",
                 container="a" * 64)
    assert answer["signature"] == "invalid"
    (path, headers), = handler.seen
    assert headers["Authorization"] == "Bearer forensics-token-0123456789abcdef" and "container=" + "a" * 64 in path


class LoggingSecrets(FakeRestarter):
    """A backend that logged its API key and an HF token at start-up, and an escape sequence."""

    def log_tail(self, container, lines):
        return ["INFO args: Namespace(api_key=['sk-live-key-0123456789', 'second-key-9876543210'])",
                "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 loaded",
                "connecting to https://admin:hunter2hunter2@db.internal/x",
                "\x1b]0;pwned\x07\x1b[2Jthe screen was cleared",
                "api key in plain words: literal-key-from-the-file-0001"]


def test_the_log_tail_is_scrubbed_and_escapes_never_reach_the_terminal(tmp_path):
    key = private_file(tmp_path / "key", "literal-key-from-the-file-0001\n")
    state = tmp_path / "state"
    from .fakes import FakeClock
    clock = FakeClock()
    h = Harness(state, clock=clock, restarter=LoggingSecrets(clock), targets=[
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000", "api_key_file": str(key)}])
    try:
        h.post(payload(h.alert()))
        h.settle()
    finally:
        h.close()
    (record,) = (state / "incidents").glob("*.json")
    text = record.read_text()
    for secret in ("sk-live-key-0123456789", "second-key-9876543210", "hf_abcdefghijklmnopqrstuvwxyz0123",
                   "hunter2hunter2", "literal-key-from-the-file-0001"):
        assert secret not in text, secret
    shown = subprocess.run([sys.executable, "-m", "hangwatch", "incidents", "show", record.name[:-5], "--state-dir",
                            str(state)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "the screen was cleared" in shown.stdout and "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "\\x1b[2J" in shown.stdout


def test_a_symlink_swap_of_the_state_dir_after_start_up_changes_nothing(tmp_path):
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    ledger = Ledger(str(state))
    ledger.append({"event": "restart", "at": 1.0, "target": "vllm-a"})
    os.rename(state, tmp_path / "state.moved")
    os.symlink(elsewhere, state)  # a neighbour who may write in the parent swaps it for a link
    ledger.append({"event": "restart", "at": 2.0, "target": "vllm-a"})
    assert list(elsewhere.iterdir()) == []
    lines = (tmp_path / "state.moved" / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["at"] for line in lines] == [1.0, 2.0]


def test_an_ancestor_others_may_write_is_refused(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)  # not sticky: anyone may rename state_dir away
    state = parent / "state"
    for sub in ("", "incidents", "locks"):
        (state / sub).mkdir(mode=0o700, exist_ok=True)
    with pytest.raises(StateDirError, match="writable by group or others"):
        check_state_dir(str(state))
    parent.chmod(0o1777)  # root-owned (we run as root) and sticky, like /tmp: fine
    if os.geteuid() == 0:
        check_state_dir(str(state))


def test_a_file_owned_by_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root to chown a file to another user (the test tier runs as root)")
    state = tmp_path / "state"
    ledger = Ledger(str(state))
    os.chown(state / "ledger.jsonl", 12345, 12345)
    with pytest.raises(Exception, match="owned by uid 12345"):
        ledger.append({"event": "restart", "at": 1.0, "target": "vllm-a"})
