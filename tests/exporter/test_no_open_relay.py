"""The exporter is no open relay and holds up against hostile peers (issue 11, exporter part).

- /probe reads ``scheme://host[:port]`` only: no path (unless that exact URL is allowlisted),
  query, fragment or credentials, and never credentials from the environment (.netrc);
  beyond loopback it needs allow_targets or allow_any_target (exit 64 otherwise).
- a hostile page cannot make the reading slow or the series unbounded (50,000 model names).
- probe work is bounded: with every worker busy, a probe is answered 503 within half its
  budget, instead of waiting (and holding memory) for as long as it likes.
- slow clients hold no thread: half-open connections are dropped after read_timeout, and
  /metrics and /probe answer while they are open (more of them than max_connections, too).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from hangwatch.demo.files import private_file
from hangwatch.exporter.config import ExporterConfig, exporter_config
from hangwatch.reading import parse
from hangwatch.settings import ConfigError
from tests.exporter.test_probe_endpoint import probe, samples
from tests.support.pages import Page, PageServer, closed_port
from tests.test_reading import VLLM_TWO_ENGINES

MAX_MODELS, MAX_MODEL_NAME = 32, 128  # documented in docs/configuration.md


def check_exposure(listen, config):
    from hangwatch.exporter.server import check_exposure
    return check_exposure(listen, config)


@pytest.fixture
def backend():
    s = PageServer()
    s.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    yield s
    s.stop()


@pytest.fixture
def exporter_with(exporters):
    return lambda **config: exporters(ExporterConfig(**config))[1]


# -- no open relay --------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [
    "/admin/shutdown", "/admin/shutdown?confirm=yes", "/?x=1", "#fragment", "/%2e%2e/admin", "/metrics",
])
def test_probe_refuses_paths_queries_and_fragments(exporter_with, backend, suffix):
    url = exporter_with()
    answer = probe(url, backend.url + suffix, "fastchat_api")
    assert answer.status_code == 400, answer.text
    assert backend.requests == []


@pytest.mark.parametrize("netloc", ["user:secret@{hostport}", "{hostport}@evil.example", "user@{hostport}"])
def test_probe_refuses_credentials(exporter_with, backend, netloc):
    url = exporter_with()
    hostport = backend.url.split("://")[1]
    answer = probe(url, "http://" + netloc.format(hostport=hostport))
    assert answer.status_code == 400 and "secret" not in answer.text
    assert backend.requests == []


class _HeaderRecorder:
    """A backend that records every request's headers (to see what the exporter sends)."""

    def __init__(self, page: bytes):
        self.headers: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                recorder.headers.append(dict(self.headers))
                body = page if self.path == "/metrics" else b"{}"
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Set-Cookie", "session=abc; Path=/")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_probe_never_sends_credentials_from_netrc_or_cookies(exporter_with, tmp_path, monkeypatch):
    netrc = private_file(tmp_path / "netrc", "machine 127.0.0.1 login admin password hunter2\n")
    monkeypatch.setenv("NETRC", str(netrc))  # requests sends these as Basic auth when it trusts the env
    recorder = _HeaderRecorder(VLLM_TWO_ENGINES.encode())
    try:
        url = exporter_with()
        for _ in range(2):  # the second scrape must not send the first answer's cookie either
            assert probe(url, recorder.url).status_code == 200
    finally:
        recorder.stop()
    sent = [{k.lower(): v for k, v in h.items()} for h in recorder.headers]
    assert sent and not any("authorization" in h or "cookie" in h for h in sent), sent


def test_a_base_path_only_when_that_exact_url_is_allowlisted(exporter_with, backend):
    backend.pages["/v1base/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    open_url = exporter_with()
    assert probe(open_url, backend.url + "/v1base").status_code == 400
    listed = exporter_with(allow_targets=(backend.url + "/v1base",))
    answer = probe(listed, backend.url + "/v1base")
    assert answer.status_code == 200 and samples(answer.text)[("hangwatch_up", ())] == 1
    assert ("GET", "/v1base/metrics") in backend.requests
    assert probe(listed, backend.url + "/admin").status_code == 403
    assert probe(listed, backend.url).status_code == 403


@pytest.mark.parametrize("listen", ["0.0.0.0:9877", "[::]:9877", "10.1.2.3:9877", "exporter:9877"])
def test_listening_beyond_loopback_needs_an_allowlist_or_an_explicit_opt_in(listen):
    with pytest.raises(ConfigError) as info:
        check_exposure(listen, ExporterConfig())
    assert str(info.value).startswith("allow_targets: required") and "allow_any_target" in str(info.value)
    check_exposure(listen, exporter_config({"allow_targets": ["http://vllm:8000"]}))
    check_exposure(listen, exporter_config({"allow_any_target": True}))


@pytest.mark.parametrize("listen", ["127.0.0.1:9877", "localhost:9877", "[::1]:9877", "127.0.0.2:0"])
def test_loopback_needs_no_allowlist(listen):
    check_exposure(listen, ExporterConfig())


def test_the_command_refuses_to_start_open_beyond_loopback():
    # Exits before binding anything (the check runs first), so 0.0.0.0 is never listened on.
    done = subprocess.run([sys.executable, "-m", "hangwatch", "exporter", "--listen", f"0.0.0.0:{closed_port()}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 64, done.stderr
    assert "allow_targets: required" in done.stderr and "allow_any_target" in done.stderr


# -- hostile pages ----------------------------------------------------------------------------------
def many_models_page(count: int, name_length: int = 20) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="m{i}-{"x" * name_length}"}} 1.0' for i in range(count)]
    lines += ["# TYPE vllm:num_requests_waiting gauge", 'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0']
    return "\n".join(lines) + "\n"


def test_fifty_thousand_model_names_are_read_in_linear_time_and_bounded():
    page = many_models_page(50_000, name_length=300)
    started = time.process_time()
    reading = parse(page)
    took = time.process_time() - started
    assert reading.running == 50_000  # every line still counts toward the load
    assert len(reading.models) == MAX_MODELS and all(len(m) <= MAX_MODEL_NAME for m in reading.models)
    assert took < 5, f"{took:.1f}s CPU for 50,000 lines"  # a quadratic check took 21.5 s


def test_names_cut_to_the_same_prefix_are_one_model():
    long = "x" * MAX_MODEL_NAME
    page = "\n".join(["# TYPE vllm:num_requests_running gauge",
                      f'vllm:num_requests_running{{engine="0",model_name="{long}a"}} 1.0',
                      f'vllm:num_requests_running{{engine="1",model_name="{long}b"}} 1.0',
                      'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0']) + "\n"
    assert parse(page).models == (long,)  # two identical label sets would fail the whole scrape


def test_a_hostile_page_gives_bounded_series(exporter_with, backend):
    backend.pages["/metrics"] = Page(many_models_page(50_000, name_length=60).encode())  # ~6 MB, under the cap
    answer = probe(exporter_with(), backend.url)
    got = samples(answer.text)
    served = [labels for name, labels in got if name == "hangwatch_model_served"]
    info = [dict(labels) for name, labels in got if name == "hangwatch_backend_info"][0]
    assert len(served) == MAX_MODELS
    assert len(info["models"]) <= MAX_MODELS * (MAX_MODEL_NAME + 1)
    assert len(answer.content) < 64 * 1024


def test_a_hostile_fastchat_worker_gives_bounded_series(exporter_with, backend):
    # 3,000 names of 300 characters (FastChat answers are read up to 1 MiB)
    short = ",".join(f'"w{i}-{"x" * 300}"' for i in range(3_000))
    backend.pages["/worker_get_status"] = Page(
        f'{{"model_names": [{short}], "speed": 1, "queue_length": 3}}'.encode(), content_type="application/json")
    got = samples(probe(exporter_with(), backend.url, "fastchat_worker").text)
    served = [labels for name, labels in got if name == "hangwatch_model_served"]
    assert got[("hangwatch_up", ())] == 1 and len(served) == MAX_MODELS


# -- bounded probe work -------------------------------------------------------------------------------
def test_with_every_worker_busy_a_probe_is_503_within_half_its_budget(exporter_with, backend):
    backend.pages["/metrics"] = Page(silent=True)  # each probe waits its whole budget
    url = exporter_with(max_concurrent_probes=2, timeout_offset=0.0)
    busy = [threading.Thread(target=probe, args=(url, backend.url), kwargs={
        "X-Prometheus-Scrape-Timeout-Seconds": "10"}) for _ in range(2)]
    for thread in busy:
        thread.start()
    deadline = time.monotonic() + 5
    while sum(1 for method, path in backend.requests if path == "/metrics") < 2:
        assert time.monotonic() < deadline, "the two probes never reached the backend"
        time.sleep(0.02)
    started = time.monotonic()
    answer = probe(url, backend.url, **{"X-Prometheus-Scrape-Timeout-Seconds": "4"})
    took = time.monotonic() - started
    assert answer.status_code == 503 and "max_concurrent_probes" in answer.text
    assert 1.8 <= took < 3.8, took   # half of a 4 s budget (2 s), not the whole of it
    own = requests.get(url + "/metrics", timeout=5).text  # answered while every worker is busy
    assert 'hangwatch_exporter_probes_total{code="503",module="backend"} 1.0' in own
    assert "hangwatch_exporter_probes_running 2.0" in own
    for thread in busy:
        thread.join(10)


# -- slow clients ---------------------------------------------------------------------------------------
def half_open(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        sockets.append(s)
    return sockets


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.mark.parametrize("count", [50, 120])  # fewer, and more, than max_connections
def test_half_open_connections_hold_no_thread_and_are_dropped(exporter_with, backend, count):
    url = exporter_with(read_timeout=1.5, max_connections=64)
    port = int(url.rsplit(":", 1)[1])
    threads_before = threading.active_count()
    slow = half_open(port, count)
    try:
        assert threading.active_count() - threads_before < 5
        assert requests.get(url + "/metrics", timeout=5).status_code == 200
        answer = probe(url, backend.url)
        assert answer.status_code == 200 and samples(answer.text)[("hangwatch_up", ())] == 1
        assert threading.active_count() - threads_before < 5
        # every half-open connection is closed by the exporter once read_timeout has passed
        assert all(closed_by_peer(s, 4) for s in slow)
    finally:
        for s in slow:
            s.close()
    own = requests.get(url + "/metrics", timeout=5).text
    dropped = sum(float(line.split()[-1]) for line in own.splitlines()
                  if line.startswith("hangwatch_exporter_connections_dropped_total{reason=\"read_timeout\"")
                  or line.startswith("hangwatch_exporter_connections_dropped_total{reason=\"evicted\""))
    assert dropped >= count - 1


def test_a_client_that_sends_its_head_byte_by_byte_is_cut_off(exporter_with):
    url = exporter_with(read_timeout=1.0)
    port = int(url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    started = time.monotonic()
    try:
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            s.sendall(bytes([byte]))
            time.sleep(0.05)
            if time.monotonic() - started > 6:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    # read_timeout is 1 s and the whole head would take 6 s: cut off well before the end
    assert closed_by_peer(s, 3) and time.monotonic() - started < 5
    s.close()


def test_requests_with_bodies_or_other_methods_are_refused(exporter_with):
    url = exporter_with()
    assert requests.post(url + "/probe", data=b"x" * 10, timeout=5).status_code in (400, 405)
    assert requests.delete(url + "/metrics", timeout=5).status_code == 405


def test_keep_alive_serves_many_requests_on_one_connection(exporter_with, backend):
    url = exporter_with()
    with requests.Session() as session:
        for _ in range(5):
            assert session.get(url + "/probe", params={"target": backend.url}, timeout=5).status_code == 200
        assert session.get(url + "/metrics", timeout=5).status_code == 200
    own = requests.get(url + "/metrics", timeout=5).text
    assert "hangwatch_exporter_connections_open" in own


def test_a_client_that_half_closes_still_gets_its_answer(exporter_with, backend):
    url = exporter_with()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET /probe?target={backend.url} HTTP/1.0\r\n\r\n".encode())
        s.shutdown(socket.SHUT_WR)  # like `nc -N`: the request is all it will send
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"hangwatch_up 1" in answer


def test_pipelined_requests_are_all_answered_in_order(exporter_with):
    """Hundreds of requests in one write (no scraper does this; a hostile client may): each
    answered, in order, none lost to a call chain nested per request."""
    url = exporter_with()
    host, port = url.split("//")[1].split(":")
    count = 400
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"".join(f"GET /nope{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(count)))
        received = b""
        deadline = time.monotonic() + 20
        while received.count(b"HTTP/1.1 404") < count and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    assert received.count(b"HTTP/1.1 404") == count


def test_the_loop_pool_shrinks_to_what_the_descriptor_limit_leaves(monkeypatch):
    """A kept idle connection must never cost a probe its socket."""
    import resource  # the process's limit, patched where every reader of it looks

    from hangwatch.exporter import fds
    config = ExporterConfig()
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100000, 100000))
    assert fds.pool_size(config) == fds.IDLE_CONNECTIONS
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2000, 2000))
    room = 2000 - fds.fds_besides_the_pool(config)
    assert 0 < fds.pool_size(config) == room < fds.IDLE_CONNECTIONS
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    assert fds.pool_size(config) == 0


def test_a_client_that_pipelines_then_half_closes_gets_every_answer(exporter_with):
    url = exporter_with()
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"".join(f"GET /nope{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(5)))
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    # Every request answered, then the connection closed (the loop above saw the end). The last
    # answer says Connection: close only if the half-close was seen before it was sent.
    assert received.count(b"HTTP/1.1 404") == 5 and received.rstrip().endswith(b"not found")
    assert received.count(b"Connection: close") <= 1
