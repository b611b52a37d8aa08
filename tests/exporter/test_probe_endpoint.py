"""The exporter: /probe answers, the allowlist, the scrape budget and its config errors."""
import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.exporter.config import ConfigError, ExporterConfig, exporter_config
from hangwatch.exporter.prober import scrape_budget
from hangwatch.exporter.server import make_server
from tests.support.pages import Page, PageServer, closed_port
from tests.test_check_bad_input import IDLE_PAGE
from tests.test_reading import VLLM_TWO_ENGINES


@pytest.fixture
def backend():
    s = PageServer()
    yield s
    s.stop()


def start_exporter(config=ExporterConfig()):
    server = make_server("127.0.0.1:0", config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def exporter(exporters):
    return exporters()[1]


def samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def probe(exporter, target, module=None, **headers):
    params = {"target": target} | ({"module": module} if module else {})
    return requests.get(exporter + "/probe", params=params, headers=headers, timeout=30)


def test_busy_backend_gives_normalized_series_and_no_probe(exporter, backend):
    backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    answer = probe(exporter, backend.url)
    assert answer.status_code == 200
    got = samples(answer.text)
    assert got[("hangwatch_up", ())] == 1
    assert got[("hangwatch_metrics_available", ())] == 1
    assert got[("hangwatch_requests_in_flight", ())] == 6
    assert got[("hangwatch_engine_steps_total", ())] == 50
    assert got[("hangwatch_engine_tokens_total", (("kind", "prompt"),))] == 150
    assert got[("hangwatch_kv_cache_usage_ratio", ())] == 0.75
    assert got[("hangwatch_backend_info", (("engine", "vllm"), ("models", "tiny"), ("module", "backend"), ("version", "")))] == 1
    assert not any(name in ("hangwatch_probe_success", "hangwatch_probe_duration_seconds") for name, _ in got)
    assert got[("hangwatch_probe_failed", ())] == 0
    # what matters to the engine: its load was read, and nothing was sent to it while busy
    assert ("GET", "/metrics") in backend.requests and not any(method == "POST" for method, _ in backend.requests)


def test_info_carries_the_engine_version(exporter, backend):
    backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
    backend.pages["/version"] = Page(b'{"version":"0.32.0"}', content_type="application/json")
    got = samples(probe(exporter, backend.url).text)
    assert got[("hangwatch_backend_info", (("engine", "vllm"), ("models", "tiny"), ("module", "backend"),
                                           ("version", "0.32.0")))] == 1


def test_idle_backend_is_probed_inside_the_scrape(exporter, backend):
    backend.pages["/metrics"] = Page(IDLE_PAGE.encode())
    backend.pages["/v1/models"] = Page(b'{"data":[{"id":"tiny"}]}')
    backend.pages["/v1/completions"] = Page(b'{"choices":[]}')
    got = samples(probe(exporter, backend.url).text)
    assert got[("hangwatch_probe_success", ())] == 1 and got[("hangwatch_probe_failed", ())] == 0
    assert ("POST", "/v1/completions") in backend.requests


def test_failed_idle_probe_is_counted_in_every_reading(exporter, backend):
    backend.pages["/metrics"] = Page(IDLE_PAGE.encode())
    backend.pages["/v1/models"] = Page(b'{"data":[{"id":"tiny"}]}')
    backend.pages["/v1/completions"] = Page(b"engine dead", 500)
    got = samples(probe(exporter, backend.url).text)
    assert got[("hangwatch_probe_success", ())] == 0 and got[("hangwatch_probe_failed", ())] == 1


def test_failed_backend_is_data_not_an_error(exporter):
    answer = probe(exporter, f"http://127.0.0.1:{closed_port()}")
    assert answer.status_code == 200
    got = samples(answer.text)
    assert got[("hangwatch_up", ())] == 0 and got[("hangwatch_connection_stalled", ())] == 0


def test_silent_backend_is_stalled_within_the_prometheus_budget(exporter, backend):
    backend.pages["/metrics"] = Page(silent=True)
    answer = probe(exporter, backend.url, **{"X-Prometheus-Scrape-Timeout-Seconds": "1.5"})
    got = samples(answer.text)
    assert got[("hangwatch_up", ())] == 0 and got[("hangwatch_connection_stalled", ())] == 1
    assert got[("hangwatch_scrape_duration_seconds", ())] < 1.5


def test_proxy_module_reads_only_v1_models(exporter, backend):
    backend.pages["/v1/models"] = Page(b'{"data":[]}')
    got = samples(probe(exporter, backend.url, "proxy").text)
    assert got[("hangwatch_up", ())] == 1
    assert backend.requests == [("GET", "/v1/models")]


@pytest.mark.parametrize("params", [{}, {"target": "ftp://x"}, {"target": "nonsense"},
                                    {"target": "http://127.0.0.1:1", "module": "nope"}])
def test_bad_probe_requests_are_400(exporter, params):
    assert requests.get(exporter + "/probe", params=params, timeout=10).status_code == 400


def test_targets_outside_the_allowlist_are_403(backend):
    server, url = start_exporter(exporter_config({"allow_targets": [backend.url]}))
    try:
        assert probe(url, "http://127.0.0.1:1").status_code == 403
        backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
        assert probe(url, backend.url + "/").status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_index_and_own_metrics(exporter):
    assert "/probe" in requests.get(exporter + "/", timeout=5).text
    assert "hangwatch_exporter_probes_total" in requests.get(exporter + "/metrics", timeout=5).text


def test_scrape_budget_follows_prometheus_header():
    config = ExporterConfig(timeout=10, timeout_offset=0.5)
    assert scrape_budget("4", config) == 3.5
    assert scrape_budget(None, config) == 10
    assert scrape_budget("junk", config) == 10
    assert scrape_budget("60", config) == 10


@pytest.mark.parametrize("data, key", [
    ({"timeot": "5s"}, "timeot: unknown key"),
    ({"timeout": "soon"}, "timeout: 'soon' is not a duration"),
    ({"timeout": 10}, "timeout: expected a duration"),  # 10 what? one parser for every config
    ({"timeout": "0s"}, "timeout: 0s is out of range"),
    ({"allow_targets": "http://x"}, "allow_targets: expected a list"),
    ({"allow_targets": ["http://ok:1", "gopher://x"]}, "allow_targets[1]: 'gopher://x' must be http(s)://HOST[:PORT]"),
    ([1, 2], "config: expected a mapping"),
])
def test_bad_config_names_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        exporter_config(data)
    assert str(info.value).startswith(key)


def test_bad_config_file_fails_before_binding(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "exporter.yml"
    bad.write_text("timeout: 5s\nallow_target: []\n")
    port = closed_port()
    done = subprocess.run([sys.executable, "-m", "hangwatch", "exporter", "--config", str(bad),
                           "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 64 and "allow_target: unknown key" in done.stderr


def test_a_client_hanging_up_is_not_an_error(capsys):
    from hangwatch.simulator.quiet import QuietThreadingHTTPServer
    server = QuietThreadingHTTPServer(("127.0.0.1", 0), object)
    try:
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            server.handle_error(None, ("127.0.0.1", 1))
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.server_close()
    err = capsys.readouterr().err
    assert "BrokenPipeError" not in err and "a real bug" in err
