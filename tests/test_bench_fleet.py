"""The scale benchmark's fleet answers as a real server does (issue #23): head and body in two
writes, a page whose counters move with every answer and stay a valid vLLM page — else the
benchmark measures a reader of canned bytes, which costs less than reading a real server."""
from __future__ import annotations

from pathlib import Path

from bench.fleet import DATA, Backend, MovingPage, answers
from hangwatch.reading import COUNTER_FIELDS, parse

PAGE = (DATA / "busy.prom").read_bytes()


class Transport:
    def __init__(self):
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass


def backend(moving: MovingPage | None) -> tuple[Backend, Transport]:
    """A backend connection fed by hand (no loop needed: its idle timer is replaced)."""
    stats = {"connections": 0, "requests": 0, "gzipped": 0}
    conn = Backend(answers(PAGE), 5.0, stats, moving, [0])
    conn._arm = lambda: None
    transport = Transport()
    conn.connection_made(transport)
    return conn, transport


def samples(page: bytes) -> dict[str, float]:
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in page.decode().splitlines() if line and not line.startswith("#")}


def test_the_moving_page_is_the_capture_at_first_and_then_every_counter_grows():
    moving = MovingPage(PAGE)
    assert moving.render(0) == PAGE  # same text, same number spellings
    first, later = samples(moving.render(1)), samples(moving.render(2))
    grown = [name for name in first if later[name] > first[name]]
    assert any(name.startswith("vllm:generation_tokens_total") for name in grown)
    assert all(later[name] == first[name] for name in first if name.startswith(("vllm:num_requests_running",
                                                                                "vllm:kv_cache_usage_perc")))
    # histograms stay histograms: buckets cumulative, _count equal to the +Inf bucket
    infinite = [name for name in later if "_bucket{" in name and 'le="+Inf"' in name]
    assert infinite
    for name in infinite:
        family, labels = name[:-1].split("_bucket{")
        rest = ",".join(pair for pair in labels.split(",") if pair != 'le="+Inf"')
        count = f"{family}_count{{{rest}}}" if rest else f"{family}_count"
        assert later[count] == later[name], name
        buckets = [value for key, value in later.items() if key.startswith(family + "_bucket{")
                   and ",".join(p for p in key[:-1].split("{", 1)[1].split(",") if not p.startswith("le=")) == rest]
        assert buckets == sorted(buckets), family  # the page lists them by le


def test_readings_of_the_moving_page_see_a_busy_engine_progressing():
    moving = MovingPage(PAGE)
    before, after = parse(moving.render(5)), parse(moving.render(6))
    assert after.running == before.running == 4
    moved = [field for field in COUNTER_FIELDS
             if getattr(before, field) is not None and getattr(after, field) > getattr(before, field)]
    assert "generation_tokens" in moved and "steps" in moved


def test_metrics_answers_in_two_writes_with_a_page_that_changed():
    conn, transport = backend(MovingPage(PAGE))
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n"
    conn.data_received(request)
    conn.data_received(request)
    assert len(transport.writes) == 4
    head, body, _, second_body = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n") and b"server: uvicorn" in head
    assert int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) == len(body)
    assert body != second_body


def test_the_static_fleet_still_answers_in_one_write_for_comparison():
    conn, transport = backend(None)
    conn.data_received(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(transport.writes) == 1 and transport.writes[0].endswith(PAGE)
    assert Path(DATA).is_dir()
