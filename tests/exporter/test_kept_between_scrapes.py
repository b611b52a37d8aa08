"""What the exporter keeps between scrapes makes them cheaper and never changes a reading:
the engine's version per process start (idle connections are hangwatch.fetch.Client's)."""
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
