"""``reading.wanted_lines`` finds exactly the lines a plain Python filter over every line would
(the line starts with a wanted name and the name stops there): the parser's strictness
(duplicates, malformed wanted lines) rests on seeing all of them, and only them."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hangwatch.reading import _PLANS, NAME_CHARS, UnreadablePage, parse, wanted_lines

DATA = Path(__file__).parent / "data"
PAGES = sorted(DATA.glob("**/*.prom"))


def by_startswith(page: str, prefixes) -> list[str]:
    return [line for line in page.split("\n")
            if any(line.startswith(name) and line[len(name):len(name) + 1] not in NAME_CHARS for name in prefixes)]


@pytest.mark.parametrize("engine", sorted(_PLANS))
@pytest.mark.parametrize("path", PAGES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_captured_pages_give_the_same_lines(path, engine):
    page = path.read_text()
    plan = _PLANS[engine]
    assert wanted_lines(page, plan) == by_startswith(page, plan.prefixes)


def _fragments():
    names = sorted({name for plan in _PLANS.values() for name in plan.prefixes})
    pieces = names + [name[:-1] for name in names] + [name + "_x" for name in names] + [
        "\n", "\r\n", "\r", "\t", ":", "0", "{", "}", " ", " 1", " 2.5 1700000000", "# TYPE ", '{model_name="m"}', "_bucket", "x"]
    return st.lists(st.sampled_from(pieces), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(page=_fragments(), engine=st.sampled_from(sorted(_PLANS)))
def test_any_text_gives_the_same_lines(page, engine):
    plan = _PLANS[engine]
    assert wanted_lines(page, plan) == by_startswith(page, plan.prefixes)


def test_a_longer_name_sharing_a_wanted_prefix_is_another_metric_and_never_read():
    """``vllm:prompt_tokens`` is wanted (older vLLM), ``vllm:prompt_tokens_cached_total`` is not:
    even malformed, it does not make the page unreadable; a malformed wanted line still does."""
    page = (DATA / "vllm-0.32" / "busy.prom").read_text()
    lines = wanted_lines(page, _PLANS["vllm"])
    assert not any(line.startswith(("vllm:prompt_tokens_cached", "vllm:prompt_tokens_created")) for line in lines)
    assert any(line.startswith("vllm:prompt_tokens_total{") for line in lines)
    other = page.replace('vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-llama"} 0.0',
                         'vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-llama"} zero', 1)
    assert other != page and parse(other, "vllm").running == parse(page, "vllm").running
    wanted = page.replace('vllm:num_requests_running{engine="0",model_name="tiny-llama"} 4.0',
                          'vllm:num_requests_running{engine="0",model_name="tiny-llama"} four', 1)
    assert wanted != page
    with pytest.raises(UnreadablePage):
        parse(wanted, "vllm")


@pytest.mark.parametrize("engine", sorted(_PLANS))
@pytest.mark.parametrize("path", PAGES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_page_read_as_bytes_gives_the_same_lines_and_reading_as_its_text(path, engine):
    """The exporter reads the page's bytes as they came (never decoding it whole)."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", "replace")
    plan = _PLANS[engine]
    assert wanted_lines(raw, plan) == wanted_lines(text, plan)
    assert _reading_or_error(raw, engine) == _reading_or_error(text, engine)
    assert _reading_or_error(raw, None) == _reading_or_error(text, None)


def _reading_or_error(page, engine):
    try:
        return parse(page, engine)
    except UnreadablePage as exc:
        return f"unreadable: {exc}"


@settings(max_examples=300, deadline=None)
@given(page=_fragments(), engine=st.sampled_from(sorted(_PLANS)),
       junk=st.sampled_from([b"", b"\xff", b"\xe2\x82", b"\xc3\xa9", b"\x1c", b"\xa0"]))
def test_any_bytes_give_the_same_lines_and_reading_as_their_text(page, engine, junk):
    """Undecodable or odd bytes anywhere (a newline is never part of a UTF-8 sequence, so
    they cannot move a line): bytes and their decoded text read the same."""
    raw = page.encode().replace(b"0", b"0" + junk)
    text = raw.decode("utf-8", "replace")
    plan = _PLANS[engine]
    assert wanted_lines(raw, plan) == wanted_lines(text, plan)
    assert _reading_or_error(raw, engine) == _reading_or_error(text, engine)
