"""What the exporter keeps between scrapes makes them cheaper and never changes a reading:
the engine's version per process start (idle connections are hangwatch.client.Client's)."""
from __future__ import annotations

from hangwatch.exporter.reuse import VersionCache
from tests.exporter.test_probe_endpoint import probe, samples
from tests.support.pages import Page, PageServer
from tests.test_reading import VLLM_TWO_ENGINES

RESTARTED = VLLM_TWO_ENGINES.replace("1.764468e+09", "1.764469e+09")


def test_the_version_is_asked_once_per_process_start(exporters):
    backend = PageServer()
    _, url = exporters()
    try:
        backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
        backend.pages["/version"] = Page(b'{"version":"0.32.0"}', content_type="application/json")
        for _ in range(3):
            got = samples(probe(url, backend.url).text)
        assert got[("hangwatch_backend_info", (("engine", "vllm"), ("models", "tiny"), ("module", "backend"),
                                               ("version", "0.32.0")))] == 1
        assert backend.requests.count(("GET", "/version")) == 1
        assert RESTARTED != VLLM_TWO_ENGINES
        backend.pages["/metrics"] = Page(RESTARTED.encode())  # a new process may be a new version
        backend.pages["/version"] = Page(b'{"version":"0.33.0"}', content_type="application/json")
        got = samples(probe(url, backend.url).text)
        assert backend.requests.count(("GET", "/version")) == 2
        assert got[("hangwatch_backend_info", (("engine", "vllm"), ("models", "tiny"), ("module", "backend"),
                                               ("version", "0.33.0")))] == 1
    finally:
        backend.stop()


def test_a_version_not_learned_is_asked_again():
    cache = VersionCache()
    cache.put("http://a:1", "vllm", 1.0, None)
    cache.put("http://a:1", "vllm", None, "0.32.0")  # no process identity: nothing to key on
    assert cache.get("http://a:1", "vllm", 1.0) is None and cache.get("http://a:1", "vllm", None) is None


def test_the_version_cache_is_bounded():
    cache = VersionCache(capacity=3)
    for i in range(10):
        cache.put(f"http://b{i}:1", "vllm", 1.0, "v")
    assert cache.get("http://b9:1", "vllm", 1.0) == "v" and cache.get("http://b0:1", "vllm", 1.0) is None


def test_an_unreadable_version_is_asked_again_with_back_off_not_on_every_scrape(exporters):
    """An empty /version once made every scrape two requests (issue 34, item 4)."""
    backend = PageServer()
    _, url = exporters()
    try:
        backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())
        backend.pages["/version"] = Page(b"", content_type="application/json")
        for _ in range(4):
            got = samples(probe(url, backend.url).text)
        assert got[("hangwatch_up", ())] == 1
        assert backend.requests.count(("GET", "/version")) == 1
        assert backend.requests.count(("GET", "/metrics")) >= 4
        backend.pages["/metrics"] = Page(RESTARTED.encode())  # a new process is asked at once
        backend.pages["/version"] = Page(b'{"version":"0.33.0"}', content_type="application/json")
        got = samples(probe(url, backend.url).text)
        assert backend.requests.count(("GET", "/version")) == 2
        assert got[("hangwatch_backend_info", (("engine", "vllm"), ("models", "tiny"), ("module", "backend"),
                                               ("version", "0.33.0")))] == 1
    finally:
        backend.stop()


def test_the_back_off_doubles_to_ten_minutes_and_ends_with_a_version():
    now = [0.0]
    cache = VersionCache(clock=lambda: now[0])
    key = ("http://a:1", "vllm", 1.0)
    waits = []
    for _ in range(7):
        cache.put(*key, None)
        assert cache.backing_off(*key)
        start = now[0]
        while cache.backing_off(*key):
            now[0] += 1.0
        waits.append(now[0] - start)
    assert waits == [30, 60, 120, 240, 480, 600, 600]
    assert not cache.backing_off("http://a:1", "vllm", 2.0)  # another process: not backed off
    cache.put(*key, None)
    cache.put(*key, "0.32.0")
    assert not cache.backing_off(*key) and cache.get(*key) == "0.32.0"
