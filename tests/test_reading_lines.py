"""``reading.wanted_lines`` finds exactly the lines a plain ``str.startswith`` filter over every
line would: the parser's strictness (duplicates, malformed wanted lines) rests on seeing all of them."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hangwatch.reading import _PLANS, wanted_lines

DATA = Path(__file__).parent / "data"
PAGES = sorted(DATA.glob("**/*.prom"))


def by_startswith(page: str, prefixes) -> list[str]:
    return [line for line in page.split("\n") if line.startswith(prefixes)]


@pytest.mark.parametrize("engine", sorted(_PLANS))
@pytest.mark.parametrize("path", PAGES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_captured_pages_give_the_same_lines(path, engine):
    page = path.read_text()
    plan = _PLANS[engine]
    assert wanted_lines(page, plan) == by_startswith(page, plan.prefixes)


def _fragments():
    names = sorted({name for plan in _PLANS.values() for name in plan.prefixes})
    pieces = names + [name[:-1] for name in names] + [name + "_x" for name in names] + [
        "\n", "\r\n", "{", "}", " ", " 1", " 2.5 1700000000", "# TYPE ", '{model_name="m"}', "_bucket", "x"]
    return st.lists(st.sampled_from(pieces), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(page=_fragments(), engine=st.sampled_from(sorted(_PLANS)))
def test_any_text_gives_the_same_lines(page, engine):
    plan = _PLANS[engine]
    assert wanted_lines(page, plan) == by_startswith(page, plan.prefixes)
