"""``reading`` keeps (``seriesroles``) what each series' labels mean (the fields it feeds, sleep, the model) per
(engine, name, labels), so a busy page whose values move costs only its values. What is kept
must never change a reading: every capture reads the same with the memo empty, full, or
emptied on the way (its bound reached)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hangwatch import reading, seriesroles
from hangwatch.reading import parse

DATA = Path(__file__).parent / "data"
PAGES = sorted(DATA.glob("*/*.prom"))


@pytest.fixture(autouse=True)
def nothing_kept():
    reading._made.clear()
    seriesroles.kept_roles.clear()
    yield
    reading._made.clear()
    seriesroles.kept_roles.clear()


def _reading_or_error(page: str):
    try:
        return parse(page)
    except reading.UnreadablePage as exc:
        return str(exc)


def test_every_capture_reads_the_same_with_the_series_kept_or_not():
    assert PAGES
    fresh = {}
    for path in PAGES:
        seriesroles.kept_roles.clear()
        fresh[path] = _reading_or_error(path.read_text())
    kept = {path: _reading_or_error(path.read_text()) for path in PAGES}  # roles kept across pages
    assert kept == fresh
    assert seriesroles.kept_roles


def test_the_same_labels_read_by_another_rule_are_not_confused():
    """A series seen once with labels the filter refuses (an aborted request) is still refused,
    and one it admits is still admitted, page after page."""
    page = (DATA / "vllm-0.32" / "busy.prom").read_text()
    stop = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-llama"} 0.0'
    abort = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny-llama"} 0.0'
    assert stop in page and abort in page
    base = parse(page, "vllm")
    for _ in range(2):
        more_stop = parse(page.replace(stop, stop[:-3] + "5.0"), "vllm")
        more_abort = parse(page.replace(abort, abort[:-3] + "5.0"), "vllm")
        assert more_stop.served == base.served + 5 and more_stop.finished == base.finished + 5
        assert more_abort.served == base.served and more_abort.finished == base.finished + 5


def test_the_kept_series_are_bounded(monkeypatch):
    monkeypatch.setattr(seriesroles, "SERIES_KEPT", 8)
    lines = [f'vllm:num_requests_running{{engine="{n}",model_name="m{n}"}} 1.0' for n in range(40)]
    page = "\n".join(lines + ['vllm:num_requests_waiting{engine="0",model_name="m0"} 2.0']) + "\n"
    first = parse(page, "vllm")
    assert len(seriesroles.kept_roles) <= 8
    assert first.running == 40 and first.waiting == 2 and first.models == tuple(f"m{n}" for n in range(32))
    assert parse(page.replace(" 1.0\n", " 2.0\n"), "vllm").running == 80


def test_long_labels_are_read_but_not_kept():
    """A page is untrusted: a series with huge labels is read every time, never kept."""
    model = "m" * 1000
    page = (f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 1.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n')
    for _ in range(2):
        read = parse(page, "vllm")
        assert read.running == 1.0 and read.models == (model[:reading.MAX_MODEL_NAME],)
    assert [key[1] for key in seriesroles.kept_roles] == ["vllm:num_requests_waiting"]
