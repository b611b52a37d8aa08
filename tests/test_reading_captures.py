"""Real vLLM 0.32 pages (tests/data/vllm-0.32, captured from a real server) read right.

The oracle is prometheus_client's full parser: for every capture, each normalized field
must equal the sum that a full parse of the same page gives. The line filter is fast
because it reads little; this proves it reads that little correctly.
"""
import pathlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.reading import parse

CAPTURES = pathlib.Path(__file__).parent / "data" / "vllm-0.32"
PAGES = sorted(CAPTURES.glob("*.prom"))

# field -> (sample name in the full parse, label filter)
ORACLE = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "steps": "vllm:iteration_tokens_total_count",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "finished": "vllm:request_success_total",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "process_start": "process_start_time_seconds",
}


def full_parse_sums(page: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def test_captures_are_present():
    assert {p.name for p in PAGES} >= {"idle.prom", "busy.prom", "prefill.prom", "frozen.prom"}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_each_field_equals_the_full_parse(path):
    page = path.read_text()
    reading, sums = parse(page), full_parse_sums(page)
    for field, sample in ORACLE.items():
        expected = sums.get(sample)
        if expected is None and field in ("running", "waiting", "kv_cache_usage"):
            expected = 0.0  # multiprocess start-up: declared, no sample yet
        assert getattr(reading, field) == expected, field


def test_what_each_capture_shows():
    read = {p.stem: parse(p.read_text()) for p in PAGES}
    assert read["idle"].in_flight == 0 and read["idle"].models == ("tiny-llama",)
    assert read["busy"].running == 4
    assert read["frozen"].running == 4
    assert read["prefill"].running == 1 and read["prefill"].prefix_cache_queries >= 20000
    if "multiprocess-start" in read:
        assert read["multiprocess-start"].process_start is None
        assert read["multiprocess-start"].in_flight == 0
