"""An idle engine's page gives the same wanted lines again and again, so ``parse`` keeps the
Reading made from them and gives it again: the same Reading, never one another page deserves.

A Reading is kept only when it depended on its wanted lines alone: a page whose families are
declared but have no sample yet (vLLM's multiprocess start-up) depends on the rest of the page.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hangwatch import reading
from hangwatch.reading import UnreadablePage, parse

DATA = Path(__file__).parent / "data" / "vllm-0.32"
IDLE = (DATA / "idle.prom").read_bytes()
STARTING = (DATA / "multiprocess-start.prom").read_bytes()


@pytest.fixture(autouse=True)
def nothing_kept():
    reading._made.clear()
    yield
    reading._made.clear()


def test_the_same_wanted_lines_give_the_same_reading_as_a_fresh_parse():
    fresh = parse(IDLE.decode())  # text is never kept: a fresh parse
    first = parse(IDLE, "vllm")
    again = parse(IDLE.replace(b"python_gc_objects_collected_total{generation=\"0\"}", b"python_gc_x{g=\"0\"}"), "vllm")
    assert first == fresh and again is first
    assert len(reading._made) == 1


def test_a_changed_wanted_line_is_parsed_anew():
    first = parse(IDLE, "vllm")
    busy = IDLE.replace(b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
                        b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0')
    assert busy != IDLE
    assert parse(busy, "vllm").running == 3.0 and parse(IDLE, "vllm") is first


def test_a_reading_that_looked_beyond_its_lines_is_not_kept():
    """Declared with no sample reads 0; the same lines without the declaration are unreadable."""
    starting = parse(STARTING, "vllm")
    assert starting.running == 0.0 and starting.waiting == 0.0
    assert reading._made == {}
    undeclared = STARTING.replace(b"# TYPE vllm:num_requests_running gauge\n", b"")
    with pytest.raises(UnreadablePage, match="num_requests_running"):
        parse(undeclared, "vllm")


def test_a_truncated_page_is_unreadable_even_when_its_lines_were_seen():
    parse(IDLE, "vllm")
    with pytest.raises(UnreadablePage, match="truncated"):
        parse(IDLE + b"vllm:num_requests_runn", "vllm")


def test_at_most_readings_kept_are_kept(monkeypatch):
    monkeypatch.setattr(reading, "READINGS_KEPT", 3)
    pages = [IDLE.replace(b"process_start_time_seconds 1.79600807877e+09",
                          b"process_start_time_seconds %d" % start) for start in range(5)]
    made = [parse(page, "vllm") for page in pages]
    assert [r.process_start for r in made] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(reading._made) == 3
    assert parse(pages[4], "vllm") is made[4]
    assert parse(pages[0], "vllm") is not made[0]  # the oldest went first
