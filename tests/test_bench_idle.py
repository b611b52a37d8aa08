"""The scale benchmark's idle fleet answers as an idle vLLM does, and what each subject sends it is
counted where it arrives (issue 34): hangwatch's scrape of an idle backend sends its 1-token
probe, and the fleet sees it; a busy backend gets no probe. Else the idle comparison with
blackbox_exporter's naive probe would compare a probe with no probe at all."""
from __future__ import annotations

import gzip
import http.client
import json
import shutil
from urllib.parse import urlsplit

import pytest

from bench.bench_exporter_scale import expected, probe_paths
from bench.fleet import DATA
from bench.processes import BLACKBOX, Blackbox, Exporter, Fleet, completion_body, loop_command
from bench.scalereport import median_rows

IDLE_PAGE = (DATA / "idle.prom").read_bytes()
MODEL = json.loads((DATA / "models.json").read_text())["data"][0]["id"]


@pytest.fixture(scope="module")
def idle_fleet():
    fleet = Fleet(3, kind="idle")
    yield fleet
    fleet.stop()


def ask(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
        connection: http.client.HTTPConnection | None = None) -> tuple[int, dict, bytes]:
    parts = urlsplit(url)
    conn = connection or http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    conn.request(method, path or "/", body=body, headers=headers or {})
    answer = conn.getresponse()
    data = answer.read()
    if connection is None:
        conn.close()
    return answer.status, {k.lower(): v for k, v in answer.getheaders()}, data


def test_the_idle_fleet_answers_like_an_idle_vllm_on_one_kept_connection(idle_fleet):
    url = idle_fleet.urls()[0]
    before = idle_fleet.stats()
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        status, headers, body = ask(url + "/metrics", headers={"Accept-Encoding": "gzip"}, connection=conn)
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert gzip.decompress(body) == IDLE_PAGE  # the real capture, nothing in flight
        status, headers, body = ask(url + "/metrics", headers={"Accept-Encoding": "identity"}, connection=conn)
        assert status == 200 and "content-encoding" not in headers and body == IDLE_PAGE
        status, _, body = ask(url + "/v1/models", connection=conn)
        assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL
        status, _, body = ask(url + "/v1/completions", "POST", completion_body().encode(),
                              {"Content-Type": "application/json"}, connection=conn)
        assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] == "length"
        status, _, body = ask(url + "/version", connection=conn)
        assert status == 200 and json.loads(body)["version"]
    finally:
        conn.close()
    after = idle_fleet.stats()
    assert after["connections"] - before["connections"] == 1  # keep-alive: five answers, one connection
    assert after["gzipped"] - before["gzipped"] == 1
    grown = {path: after["paths"][path] - before["paths"].get(path, 0) for path in after["paths"]}
    assert grown == {"GET /metrics": 2, "GET /v1/models": 1, "POST /v1/completions": 1, "GET /version": 1}


def test_the_idle_page_stays_still_and_the_busy_page_moves():
    fleets = [Fleet(1, kind="idle"), Fleet(1, kind="busy")]
    try:
        idle, busy = ([ask(f.urls()[0] + "/metrics")[2] for _ in range(2)] for f in fleets)
        assert idle[0] == idle[1] == IDLE_PAGE
        assert busy[0] != busy[1]
    finally:
        for fleet in fleets:
            fleet.stop()


def scrape(exporter: Exporter, path: str) -> str:
    status, _, body = ask(exporter.url + path)
    assert status == 200, body
    return body.decode()


def test_a_hangwatch_scrape_of_an_idle_backend_sends_the_probe_that_reaches_the_fleet(idle_fleet, tmp_path):
    exporter = Exporter(tmp_path)
    busy = Fleet(1, kind="busy")
    try:
        before = idle_fleet.stats()["paths"].get("POST /v1/completions", 0)
        text = scrape(exporter, probe_paths(idle_fleet.urls()[1:2], "hangwatch", "idle")[0])
        assert "hangwatch_requests_in_flight 0.0" in text
        assert expected("hangwatch", "idle").decode() in text  # hangwatch_probe_success 1 (a sample)
        assert idle_fleet.stats()["paths"]["POST /v1/completions"] == before + 1  # it arrived
        text = scrape(exporter, probe_paths(busy.urls(), "hangwatch", "busy")[0])
        assert expected("hangwatch", "busy").decode() in text and "hangwatch_probe_success" not in text
        assert "POST /v1/completions" not in busy.stats()["paths"]  # busy: no probe
    finally:
        busy.stop()
        exporter.stop()


def test_the_exporter_asks_v1_models_once_per_process_so_an_idle_scrape_is_three_requests(idle_fleet, tmp_path):
    """The model the idle probe names is kept per target and process start (``ModelMemo``): the
    first scrape of an idle backend asks /v1/models, the next ones send only the two readings and
    the probe — counted where they arrive, at the fleet."""
    exporter = Exporter(tmp_path)
    path = probe_paths(idle_fleet.urls()[2:3], "hangwatch", "idle")[0]
    try:
        def grown(before: dict) -> dict:
            after = idle_fleet.stats()["paths"]
            return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}

        before = idle_fleet.stats()["paths"]
        assert expected("hangwatch", "idle").decode() in scrape(exporter, path)
        first = grown(before)
        assert first.get("GET /v1/models") == 1 and first.get("POST /v1/completions") == 1, first
        for _ in range(2):
            before = idle_fleet.stats()["paths"]
            assert expected("hangwatch", "idle").decode() in scrape(exporter, path)
            assert grown(before) == {"GET /metrics": 2, "POST /v1/completions": 1}
    finally:
        exporter.stop()


@pytest.mark.skip_allowed("blackbox_exporter is an optional benchmark tool; the tests above need nothing")
@pytest.mark.skipif(not (shutil.which(BLACKBOX) or shutil.which("blackbox_exporter")),
                    reason="blackbox_exporter is not installed")
def test_blackbox_posts_the_same_one_token_completion_to_an_idle_backend(idle_fleet, tmp_path):
    blackbox = Blackbox(tmp_path)
    try:
        before = idle_fleet.stats()["paths"]
        path = probe_paths(idle_fleet.urls()[2:3], "blackbox", "idle")[0]
        status, _, body = ask(f"http://127.0.0.1:{blackbox.port}{path}")
        assert status == 200 and expected("blackbox", "idle") in body
        after = idle_fleet.stats()["paths"]
        assert after["POST /v1/completions"] == before.get("POST /v1/completions", 0) + 1
        assert after.get("GET /metrics") == before.get("GET /metrics")  # the naive probe reads nothing else
    finally:
        blackbox.stop()


def test_each_tree_is_told_its_loop_its_own_way():
    assert loop_command("evloop", True)[1] == {}
    assert loop_command("uvloop", True)[0][-1].endswith("loopchoice.py")
    assert loop_command("asyncio", False)[1] == {"HANGWATCH_LOOP": "asyncio"}
    assert loop_command("uvloop", False)[1] == {"HANGWATCH_LOOP": "uvloop"}
    for loop, evloop_tree in (("asyncio", True), ("evloop", False), ("trio", False)):
        with pytest.raises(ValueError):
            loop_command(loop, evloop_tree)


def row(fleet: str, subject: str, cpu: float, failed: int = 0) -> dict:
    return {"fleet": fleet, "subject": subject, "shape": "spread", "backends": 3, "cpu_ms_per_scrape": cpu,
            "p50_ms": 1.0, "p99_ms": 2.0, "failed": failed, "scrapes": 3, "max_rss_mb": 20.0, "max_threads": 3,
            "max_fds": 9, "fleet_cpu_ms_per_scrape": 0.1, "fleet_requests_per_scrape": 1.0,
            "fleet_paths_per_scrape": {"POST /v1/completions": 1.0}}


def test_the_report_takes_medians_per_fleet_and_divides_by_blackbox_on_the_same_fleet():
    rows = [row("idle", "uvloop", cpu) for cpu in (3.0, 9.0, 4.0)] + [row("idle", "blackbox", 2.0),
                                                                       row("busy", "blackbox", 1.0),
                                                                       row("busy", "uvloop", 0.5, failed=2)]
    found = {(m["fleet"], m["subject"]): m for m in median_rows(rows)}
    assert found["idle", "uvloop"]["cpu_ms_per_scrape"] == 4.0
    assert found["idle", "uvloop"]["ratio_to_blackbox"] == 2.0
    assert found["busy", "uvloop"]["ratio_to_blackbox"] == 0.5 and found["busy", "uvloop"]["failed_runs"] == 1
    assert found["busy", "blackbox"]["ratio_to_blackbox"] is None
