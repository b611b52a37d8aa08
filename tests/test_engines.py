"""One engine table, the same verdicts: llama.cpp, SGLang and TGI pages through parse and judge.

The SGLang and TGI pages are built in ``harness/engine_pages.py`` from their documented metric definitions, as their
own code declares them (SGLang: ``python/sglang/srt/metrics/collector.py`` through
prometheus_client, exactly as SGLang renders them; TGI: the router's ``metrics`` crate
names from the docs' "Metrics" page, rendered the way ``metrics-exporter-prometheus`` does:
no ``_total`` suffix, series absent until first set). Neither engine can run on these
machines, so these pages are documents, not captures. The llama.cpp pages are real: captured
from llama-server 11434 (``tests/data/llamacpp/README.md``).

The engine table in docs/engines.md is generated from ``hangwatch/engines.py`` and checked
here; ``python3 -m tests.test_engines`` rewrites it (review the diff). The test only compares:
no setting makes it rewrite the page and pass.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hangwatch.engines import ENGINES, ENGINES_BY_NAME, detect_engine
from hangwatch.observe import Observation
from hangwatch.reading import Reading, UnreadablePage, parse
from hangwatch.verdict import judge
from harness.engine_pages import sglang_page, tgi_page

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "llamacpp"
DOC = ROOT / "docs" / "engines.md"


# --------------------------------------------------------------------------------------------
# Pages from the documents


def captured(name: str) -> str:
    return (DATA / name).read_text()


def observations(readings_at: list[tuple[float, Reading]]) -> list[Observation]:
    return [Observation(at, "ok", reading=reading) for at, reading in readings_at]


# --------------------------------------------------------------------------------------------
# Detection: from the page, never guessed


@pytest.mark.parametrize("page, engine", [
    (sglang_page(), "sglang"),
    (tgi_page(), "tgi"),
    (tgi_page(fresh=True), "tgi"),
], ids=["sglang", "tgi", "tgi-fresh"])  # names: a page holds *_created times made at collection
def test_engine_is_detected_from_the_page(page, engine):
    assert detect_engine(page).name == engine
    assert parse(page).engine == engine


def test_captured_llamacpp_pages_are_detected():
    for path in sorted(DATA.glob("*.prom")):
        assert parse(path.read_text()).engine == "llamacpp", path.name


@pytest.mark.parametrize("page", [
    "# TYPE http_requests_total counter\nhttp_requests_total 3\n",
    "# TYPE ollama_whatever gauge\nollama_whatever 1\n",
    "",
], ids=["generic-counter", "ollama-gauge", "empty"])
def test_an_unknown_page_is_blind_never_guessed(page):
    with pytest.raises(UnreadablePage, match="no known engine"):
        parse(page)


def test_engine_set_per_target_must_match_the_page():
    with pytest.raises(UnreadablePage, match="sglang page without sglang:num_running_reqs"):
        parse(tgi_page(), engine="sglang")


# --------------------------------------------------------------------------------------------
# SGLang


def test_sglang_page_normalizes():
    r = parse(sglang_page())
    assert (r.running, r.waiting, r.in_flight) == (4, 2, 6)
    assert (r.steps, r.prompt_tokens, r.generation_tokens, r.finished) == (1000, 5000, 20000, 40)
    assert r.kv_cache_usage == pytest.approx(0.31)
    assert r.models == ("tiny-llama",)
    # SGLang serves prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR): no
    # process_* series, so a restart shows as counters going backwards.
    assert r.process_start is None


def test_sglang_data_parallel_ranks_are_summed():
    r = parse(sglang_page(running=4, queued=2, passes=1000, ranks=(0, 1)))
    assert (r.running, r.waiting, r.steps) == (4, 2, 1000)


def test_sglang_without_forward_pass_counter_still_has_progress():
    """Older SGLang has no cuda_graph_passes: KV usage and the finish counters remain."""
    r = parse(sglang_page(with_passes=False))
    assert r.steps is None
    before = r
    after = parse(sglang_page(with_passes=False, usage=0.33))
    verdict = judge(observations([(0, before), (15, after)]))
    assert verdict.state == "busy" and "kv_cache_usage" in verdict.reason


def test_sglang_stale_gauges_after_the_last_request_are_not_hung():
    """SGLang re-sets running/queue only when it logs stats (every 30 s at idle): right after
    the last request finished, running still reads 1 for up to 30 s and nothing moves."""
    done = parse(sglang_page(running=1, queued=0, finished=41))
    stale = [parse(sglang_page(running=1, queued=0, finished=41)) for _ in range(3)]
    obs = observations([(0, parse(sglang_page(running=1, queued=0, finished=40))), (5, done),
                        (20, stale[0]), (35, stale[1])])
    assert judge(obs).state == "busy"  # 30 s flat: within SGLang's 45 s
    assert judge(obs + observations([(55, stale[2])])).state == "hung"  # 50 s flat: wedged


# --------------------------------------------------------------------------------------------
# TGI


def test_tgi_page_normalizes():
    r = parse(tgi_page())
    assert (r.running, r.waiting) == (4, 2)
    assert r.steps == 910  # prefill + decode calls
    assert (r.finished, r.generation_tokens) == (30, 4500)
    assert r.prompt_tokens is None  # tgi_request_input_length is observed before any engine work
    assert r.process_start is None and r.kv_cache_usage is None


def test_fresh_tgi_without_queue_gauges_is_idle_not_blind():
    r = parse(tgi_page(fresh=True))
    assert (r.running, r.waiting, r.steps) == (0, 0, None)


def test_tgi_decode_calls_are_progress_and_a_frozen_router_is_hung():
    a, b = parse(tgi_page(decode=900)), parse(tgi_page(decode=960))
    assert judge(observations([(0, a), (15, b)])).state == "busy"
    frozen = observations([(0, a), (15, b), (30, b), (45, b)])
    assert judge(frozen).state == "hung"


# --------------------------------------------------------------------------------------------
# llama.cpp


def test_llamacpp_throughput_gauges_are_never_read():
    """The *_seconds gauges are reset by every read of /metrics: no field comes from them."""
    page = captured("busy-4-slots-2-deferred.prom")
    r = parse(page)
    bumped = re.sub(r"^(llamacpp:(?:prompt|predicted)_tokens_seconds) .*$", r"\1 99999", page, flags=re.M)
    assert parse(bumped) == r


def test_llamacpp_captured_busy_page():
    r = parse(captured("busy-4-slots-2-deferred.prom"))
    assert (r.running, r.waiting) == (4, 2)
    assert r.steps > 0 and r.process_start is None and r.kv_cache_usage is None


def test_llamacpp_captured_idle_page():
    r = parse(captured("idle.prom"))
    assert r.in_flight == 0


def test_llamacpp_one_long_batch_is_busy_until_the_grace_passes():
    """A long prompt advances n_decode_total once per batch, seconds apart (≈ 11 s measured
    for one 4096-token batch): readings 2 s apart see nothing move, and that is not a hang
    until llama.cpp's minimum grace has passed."""
    r = parse(captured("long-prompt-one-batch.prom"))
    assert r.running == 1
    flat = observations([(t, r) for t in (0, 2, 4, 6, 8, 10, 12)])
    assert judge(flat).state == "busy"
    assert "grace" in judge(flat).reason
    assert judge(flat + observations([(31, r)])).state == "hung"
    assert judge(flat + observations([(31, r)]), grace=60).state == "busy"


# --------------------------------------------------------------------------------------------
# The docs' engine table is generated from the one table


def _series(names: tuple[str, ...], counter: bool = False) -> str:
    if not names:
        return "—"
    # The Rust metrics crate (TGI) adds no _total to counters; prometheus_client and llama.cpp do.
    def suffix(n):
        return counter and not n.startswith("tgi_") and not n.endswith(("_count", "_sum", "_bucket"))
    shown = [n + "_total" if suffix(n) else n for n in names]
    return " or ".join(f"`{n}`" for n in shown)


def _output_series(e, field: str) -> str:
    shown = _series(e.counters[field], counter=True)
    wanted = e.label_filters.get(field)
    if wanted is None:
        return shown
    if wanted.keep:
        return shown + f" with `{wanted.label}` " + " or ".join(f'"{v}"' for v in wanted.keep)
    return shown + f" except `{wanted.label}` " + " or ".join(f'"{v}"' for v in wanted.drop)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def render_engine_table() -> str:
    rows = [
        ("detected by", lambda e: f"`{e.marker}` on the page"),
        ("running", lambda e: _series(e.running)),
        ("waiting", lambda e: _series(e.waiting)),
        ("heartbeat (steps)", lambda e: _series(e.counters.get("steps", ()), counter=True)),
        ("other progress", lambda e: ", ".join(
            _series(e.counters.get(f, ()), counter=True) if f in e.counters else _series(e.gauges.get(f, ()))
            for f in e.progress if f != "steps") or "—"),
        ("output (a stall is none of these for the stall window)", lambda e: ", ".join(
            _output_series(e, f) for f in e.output) or "—"),
        ("stall window (default)", lambda e: f"{_minutes(e.stall_window)}: {e.stall_note}"),
        ("during one long prompt", lambda e: e.prefill),
        ("process start", lambda e: _series(e.process_start) if e.process_start else
         "none: a restart shows as counters going backwards"),
        ("absent means 0", lambda e: ", ".join(e.absent_is_zero) or "—"),
        ("minimum grace", lambda e: f"{e.min_grace:g} s" if e.min_grace else "0 (two intervals)"),
        ("never relied on", lambda e: "; ".join(f"`{k}`: {v}" for k, v in e.unreliable.items()) or "—"),
        ("verified", lambda e: e.verified),
    ]
    out = ["| | " + " | ".join(e.label for e in ENGINES) + " |",
           "|---|" + "---|" * len(ENGINES)]
    for title, cell in rows:
        out.append(f"| {title} | " + " | ".join(cell(e).replace("|", "\\|") for e in ENGINES) + " |")
    return "\n".join(out)


def render_verdict_table() -> str:
    """What each verdict rests on, per engine (the rules of hangwatch/verdict.py, with each
    engine's own series filled in)."""
    def progress(e):
        names = []
        for f in e.progress:
            names.append(_series(e.counters[f], counter=True) if f in e.counters else _series(e.gauges[f]))
        return ", ".join(names)

    rows = [
        ("idle", lambda e: f"{_series(e.running)} + {_series(e.waiting)} = 0, and one 1-token "
                           "`/v1/completions` probe answers (sent only then)"),
        ("busy", lambda e: f"in flight > 0 and one of {progress(e)} moved between two readings; never probed"),
        ("hung", lambda e: "in flight > 0 and none of those moved across two intervals"
                           + (f" and at least {e.min_grace:g} s (or `--grace`, if longer)" if e.min_grace
                              else " (and `--grace`, if given)")
                           + "; or the connection is accepted and nothing answers twice in a row; "
                             "or the idle probe fails twice"),
        ("stalled (rules; `check --stall-window`)", lambda e: "in flight > 0 in every reading for the stall window "
                              f"({_minutes(e.stall_window)}, or the target's `stall_window`) and none of "
                              + ", ".join(_output_series(e, f) for f in e.output)
                              + " moved; deferred requests count as in flight"),
        ("restarted", lambda e: (f"{_series(e.process_start)} changed" if e.process_start else
                                 "a counter went backwards") + "; counters of two processes are never compared"),
        ("blind", lambda e: "/metrics answers but is unusable: not a known engine page, truncated, NaN, "
                            + ("or a duplicate series (a missing gauge means 0: never set)"
                               if "running" in e.absent_is_zero else
                               f"a duplicate series, or no {_series(e.running)}")),
        ("down", lambda e: "connection refused or unreachable (a server loading weights looks the same)"),
    ]
    out = ["| verdict | " + " | ".join(e.label for e in ENGINES) + " |",
           "|---|" + "---|" * len(ENGINES)]
    for title, cell in rows:
        out.append(f"| {title} | " + " | ".join(cell(e).replace("|", "\\|") for e in ENGINES) + " |")
    return "\n".join(out)


BEGIN = "<!-- BEGIN engine table: generated from hangwatch/engines.py (tests/test_engines.py) -->"
END = "<!-- END engine table -->"
VERDICTS_BEGIN = "<!-- BEGIN verdict table: generated from hangwatch/engines.py (tests/test_engines.py) -->"
VERDICTS_END = "<!-- END verdict table -->"


def _generated(text: str, begin: str, end: str) -> str:
    return text[text.index(begin) + len(begin):text.index(end)]


@pytest.mark.parametrize("begin, end, render", [
    (BEGIN, END, render_engine_table),
    (VERDICTS_BEGIN, VERDICTS_END, render_verdict_table),
])
def test_docs_engine_tables_are_generated_from_the_engine_table(begin, end, render):
    current, table = _generated(DOC.read_text(), begin, end), "\n" + render() + "\n"
    assert current == table, "docs/engines.md is stale: python3 -m tests.test_engines rewrites it"


def write_docs() -> bool:
    """Rewrite docs/engines.md's generated tables from hangwatch/engines.py; True if it changed."""
    text = original = DOC.read_text()
    for begin, end, render in ((BEGIN, END, render_engine_table), (VERDICTS_BEGIN, VERDICTS_END, render_verdict_table)):
        text = text.replace(begin + _generated(text, begin, end) + end, begin + "\n" + render() + "\n" + end)
    DOC.write_text(text)
    return text != original


def test_every_engine_says_where_it_was_verified():
    for engine in ENGINES:
        assert engine.verified.startswith(("real server:", "documents only:")), engine.name
        assert engine.label and engine.prefill, engine.name
    assert ENGINES_BY_NAME["llamacpp"].verified.startswith("real server:")
    assert ENGINES_BY_NAME["sglang"].verified.startswith("documents only:")
    assert ENGINES_BY_NAME["tgi"].verified.startswith("documents only:")


# --------------------------------------------------------------------------------------------
# The exporter: the same normalized series for every engine, the engine as a label


@pytest.fixture
def backend():
    from tests.support.pages import PageServer
    server = PageServer()
    yield server
    server.stop()


@pytest.mark.parametrize("engine, page, absent", [
    ("llamacpp", captured("busy-4-slots-2-deferred.prom"),
     ("hangwatch_process_start_time_seconds", "hangwatch_prefix_cache_queries_total",
      "hangwatch_requests_finished_total", "hangwatch_kv_cache_usage_ratio")),
    ("sglang", sglang_page(), ("hangwatch_process_start_time_seconds", "hangwatch_prefix_cache_queries_total")),
    ("tgi", tgi_page(), ("hangwatch_process_start_time_seconds", "hangwatch_kv_cache_usage_ratio",
                         "hangwatch_prefix_cache_queries_total")),
], ids=["llamacpp", "sglang", "tgi"])  # names: the pages hold *_created times made at collection
def test_exporter_series_are_normalized_for_every_engine(backend, engine, page, absent):
    from tests.support.exposition import samples, scrape
    from tests.support.pages import Page

    backend.pages["/metrics"] = Page(page.encode())
    series = samples(scrape(backend.url, "backend", 5.0))
    names = {name for name, _ in series}
    assert series[("hangwatch_requests_in_flight", ())] == 6
    assert "hangwatch_engine_steps_total" in names
    assert not names & {"hangwatch_probe_success", "hangwatch_probe_duration_seconds"}  # busy: never probed
    assert series[("hangwatch_probe_failed", ())] == 0
    assert not names & set(absent), names & set(absent)  # left out, not faked
    info = [dict(labels) for name, labels in series if name == "hangwatch_backend_info"]
    assert info and info[0]["engine"] == engine
    assert ("POST", "/v1/completions") not in backend.requests


if __name__ == "__main__":
    print(f"{DOC}: {'rewritten (review the diff)' if write_docs() else 'already up to date'}")
