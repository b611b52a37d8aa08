"""The exporter's server runs on the loop ``new_event_loop`` picks (uvloop where it installs,
``HANGWATCH_LOOP`` overriding), and a scrape is awaited on it: neither ``/probe`` of an idle
backend (two readings, the idle probe, the version) nor ``/livez`` starts a thread."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import requests

from hangwatch.exporter.config import ExporterConfig
from hangwatch.exporter.httpserver import BoundedHTTPServer, Response, Route, new_event_loop
from tests.support.pages import Page, PageServer
from tests.test_check_bad_input import IDLE_PAGE

uvloop = pytest.importorskip("uvloop")

LOOPS = {"asyncio": asyncio.BaseEventLoop, "uvloop": uvloop.Loop}


@pytest.mark.parametrize("choice", list(LOOPS))
def test_the_server_runs_on_the_chosen_loop(monkeypatch, choice):
    monkeypatch.setenv("HANGWATCH_LOOP", choice)
    seen = []

    def which(request):
        seen.append(asyncio.get_running_loop())
        return Response(200, "text/plain", b"ok\n")
    server = BoundedHTTPServer(("127.0.0.1", 0), {"/which": Route(which, inline=True)})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_address[1]}/which", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert answer.status_code == 200 and len(seen) == 1
    assert isinstance(seen[0], LOOPS[choice]), type(seen[0])


def test_uvloop_is_the_default_and_a_wrong_choice_is_an_error(monkeypatch):
    monkeypatch.delenv("HANGWATCH_LOOP", raising=False)
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv("HANGWATCH_LOOP", "evloop")
    with pytest.raises(ValueError, match="HANGWATCH_LOOP"):
        new_event_loop()


@pytest.fixture
def idle_backend():
    backend = PageServer()
    backend.pages["/metrics"] = Page(IDLE_PAGE.encode())
    backend.pages["/v1/models"] = Page(b'{"data":[{"id":"tiny"}]}')
    backend.pages["/v1/completions"] = Page(b'{"choices":[]}')
    backend.pages["/version"] = Page(b'{"version":"0.32.0"}', content_type="application/json")
    yield backend
    backend.stop()


class ThreadsStarted:
    """The names of the threads started meanwhile, but the test backend's own (one per connection)."""

    def __init__(self, monkeypatch):
        self.names: list[str] = []
        start = threading.Thread.start

        def counted(thread):
            self.names.append(thread.name)
            return start(thread)
        monkeypatch.setattr(threading.Thread, "start", counted)

    def ours(self) -> list[str]:
        return [name for name in self.names if "process_request_thread" not in name]


@pytest.mark.parametrize("choice", list(LOOPS))
def test_a_scrape_of_an_idle_backend_starts_no_thread(exporters, idle_backend, monkeypatch, choice):
    monkeypatch.setenv("HANGWATCH_LOOP", choice)
    _, url = exporters(ExporterConfig())
    requests.get(f"{url}/metrics", timeout=10)  # the server is up and has answered once
    started = ThreadsStarted(monkeypatch)
    answer = requests.get(f"{url}/probe", params={"target": idle_backend.url}, timeout=20)
    assert answer.status_code == 200 and "hangwatch_probe_success 1.0" in answer.text, answer.text[:500]
    assert ("POST", "/v1/completions") in idle_backend.requests  # the idle probe went out
    assert ("GET", "/version") in idle_backend.requests
    assert started.ours() == []


def test_livez_and_readyz_start_no_thread(exporters, idle_backend, monkeypatch):
    _, url = exporters(ExporterConfig(liveness_interval=0.3, liveness_timeout=0.3, liveness_budget=1.5))
    requests.get(f"{url}/metrics", timeout=10)
    started = ThreadsStarted(monkeypatch)
    for endpoint in ("livez", "readyz"):
        answer = requests.get(f"{url}/{endpoint}", params={"target": idle_backend.url}, timeout=20)
        assert answer.status_code == 200, answer.text
    assert started.ours() == []


def test_an_error_in_an_awaited_probe_is_a_500_and_its_slot_comes_back(exporters, idle_backend, monkeypatch):
    """Whatever goes wrong after the backend was read, the scrape gets an answer and its slot back."""
    from hangwatch.exporter import prober

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(prober, "render_series", broken)
    _, url = exporters(ExporterConfig(max_concurrent_probes=1))
    for _ in range(2):  # the one slot came back: the second is answered too
        assert requests.get(f"{url}/probe", params={"target": idle_backend.url}, timeout=10).status_code == 500


def test_a_client_that_resets_mid_probe_gives_its_slot_back_at_once(exporters, monkeypatch):
    """The probe's task is cancelled with its connection: a stalled backend holds no slot for a
    scrape nobody can read any more (a thread could only be abandoned, holding it). (A half-close
    is not a reset: that client still gets its answer.)"""
    import socket
    import struct
    import time

    stalled, healthy = PageServer(), PageServer()
    stalled.pages["/metrics"] = Page(silent=True)
    healthy.pages["/metrics"] = Page(IDLE_PAGE.encode())
    healthy.pages["/v1/completions"] = Page(b'{"choices":[]}')
    try:
        server, url = exporters(ExporterConfig(max_concurrent_probes=1, timeout=30))
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.sendall(f"GET /probe?target={stalled.url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            deadline = time.monotonic() + 10
            while server.stats.work_running < 1:
                assert time.monotonic() < deadline, "the probe never started"
                time.sleep(0.02)
        while server.stats.work_running:
            assert time.monotonic() < deadline, "the slot stayed taken"
            time.sleep(0.02)
        answer = requests.get(f"{url}/probe", params={"target": healthy.url}, timeout=10)
        assert answer.status_code == 200 and "hangwatch_up 1.0" in answer.text
    finally:
        stalled.stop()
        healthy.stop()


def test_an_unknown_loop_stops_the_exporter_before_it_listens(monkeypatch, capsys):
    from types import SimpleNamespace

    from hangwatch.exporter.server import main
    monkeypatch.setenv("HANGWATCH_LOOP", "evloop")
    code = main(SimpleNamespace(config=None, listen="127.0.0.1:0", log_level=None, log_format="text"))
    assert code == 64 and "HANGWATCH_LOOP='evloop'" in capsys.readouterr().err


class Merged(list):
    """Requests of several backends in the order they arrived: (backend, method, path)."""

    def __init__(self, name: str, into: list):
        super().__init__()
        self.name, self.into = name, into

    def append(self, item) -> None:
        super().append(item)
        self.into.append((self.name, item[0], item[1]))


def test_an_idle_probe_lends_its_slot_out_while_its_idle_confirmation_waits(exporters, monkeypatch):
    """With one probe slot, a second idle probe is read while the first one waits between its two
    readings (held through that wait, 64 slots answered a cold burst of 1,000 probes 503). The
    wait is made 2 s so that the second probe, sent once the first one's first reading is in,
    arrives within it on a loaded machine."""
    monkeypatch.setattr("hangwatch.observe.IDLE_CONFIRM_S", 2.0)
    arrived: list[tuple[str, str, str]] = []
    backends = {}
    for name in ("a", "b"):
        backend = backends[name] = PageServer()
        backend.pages["/metrics"] = Page(IDLE_PAGE.encode())
        backend.pages["/v1/models"] = Page(b'{"data":[{"id":"tiny"}]}')
        backend.pages["/v1/completions"] = Page(b'{"choices":[]}')
        backend.pages["/version"] = Page(b'{"version":"0.32.0"}', content_type="application/json")
        backend.sent = Merged(name, arrived)
    try:
        _, url = exporters(ExporterConfig(max_concurrent_probes=1))
        requests.get(f"{url}/metrics", timeout=10)
        answers = {}

        def scrape(name):
            answers[name] = requests.get(f"{url}/probe", params={"target": backends[name].url}, timeout=20)
        threads = {name: threading.Thread(target=scrape, args=(name,)) for name in backends}
        threads["a"].start()
        deadline = time.monotonic() + 20
        while ("a", "GET", "/metrics") not in arrived:  # a holds the one slot, then waits
            assert time.monotonic() < deadline, "the first probe never read its backend"
            time.sleep(0.01)
        threads["b"].start()
        for thread in threads.values():
            thread.join(30)
    finally:
        for backend in backends.values():
            backend.stop()
    for name, answer in answers.items():
        assert answer.status_code == 200 and "hangwatch_probe_success 1.0" in answer.text, (name, answer.text[:300])
    readings = [name for name, method, path in arrived if path == "/metrics"]
    assert readings[:2] == ["a", "b"] and sorted(readings) == ["a", "a", "b", "b"], \
        f"the second probe waited for the first one's whole observation: {arrived}"
