"""The probe's model is remembered per process: an idle scrape is three requests, not four.

A process cannot change the base model it serves without restarting, and a restart changes its
start time, so ``ModelMemo`` keeps the first model of /v1/models per (target, process start).
Counted at a real test server: the first idle observation asks /v1/models, the next ones do
not; a restarted process, a page without a start time, and a probe told "the model does not
exist" are asked again. Without a memo (the CLI) every probe asks.
"""
from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.models_memo import ModelMemo
from hangwatch.observation import PROBE_AUTO, PROBE_EMBEDDING, Options
from hangwatch.observe import observe_backend
from tests.support.pages import Page, PageServer

DATA = Path(__file__).parent / "data" / "vllm-0.32"
IDLE_PAGE = (DATA / "idle.prom").read_bytes()
MODELS = (DATA / "models.json").read_bytes()
COMPLETION = (DATA / "completion-max-tokens-1.json").read_bytes()
EMBEDDING = b'{"object":"list","data":[{"index":0,"object":"embedding","embedding":[0.1,0.2]}]}'
START_LINE = b"\nprocess_start_time_seconds 1.79600807877e+09\n"
NO_SUCH_MODEL = json.dumps({"error": {"message": "The model `tiny-llama` does not exist.", "type": "NotFoundError",
                                      "param": "model", "code": 404}}).encode()


# -- the memo itself ---------------------------------------------------------------------------

def test_a_model_is_remembered_for_one_process_start():
    memo = ModelMemo()
    memo.remember("http://a", 100.0, "llama")
    assert memo.model("http://a", 100.0) == "llama"
    assert memo.model("http://a", 101.0) is None  # restarted: another process
    assert memo.model("http://b", 100.0) is None  # another target


def test_a_restart_replaces_the_model_remembered():
    memo = ModelMemo()
    memo.remember("http://a", 100.0, "llama")
    memo.remember("http://a", 200.0, "qwen")
    assert memo.model("http://a", 200.0) == "qwen" and memo.model("http://a", 100.0) is None
    assert len(memo) == 1


def test_without_a_start_time_nothing_is_remembered():
    memo = ModelMemo()
    memo.remember("http://a", None, "llama")
    assert memo.model("http://a", None) is None and len(memo) == 0


def test_forgetting_makes_the_next_probe_ask():
    memo = ModelMemo()
    memo.remember("http://a", 100.0, "llama")
    memo.forget("http://a")
    memo.forget("http://never-seen")
    assert memo.model("http://a", 100.0) is None


def test_the_memo_is_bounded_and_the_least_recently_used_goes_first():
    memo = ModelMemo(size=2)
    memo.remember("http://a", 1.0, "m")
    memo.remember("http://b", 1.0, "m")
    assert memo.model("http://a", 1.0) == "m"  # a is now the most recently used
    memo.remember("http://c", 1.0, "m")
    assert len(memo) == 2
    assert memo.model("http://b", 1.0) is None
    assert memo.model("http://a", 1.0) == "m" and memo.model("http://c", 1.0) == "m"
    with pytest.raises(ValueError):
        ModelMemo(size=0)


# -- counted at a server -----------------------------------------------------------------------

@pytest.fixture
def backend():
    server = PageServer()
    server.pages["/metrics"] = Page(IDLE_PAGE)
    server.pages["/v1/models"] = Page(MODELS, content_type="application/json")
    server.pages["/v1/completions"] = Page(COMPLETION, content_type="application/json")
    server.pages["/v1/embeddings"] = Page(EMBEDDING, content_type="application/json")
    try:
        yield server
    finally:
        server.stop()


def observe(server: PageServer, known: ModelMemo | None, probe: str = PROBE_AUTO) -> list[str]:
    """One idle observation; the requests it sent, in order."""
    before = len(server.requests)
    client = Client()
    try:
        observation = asyncio.run(observe_backend(client, server.url, Deadline.after(5),
                                                  Options(engine="vllm", probe=probe), known=known))
    finally:
        client.close()
    assert observation.reading is not None and observation.probe is not None
    return [f"{method} {path}" for method, path in server.requests[before:]]


FIRST = ["GET /metrics", "GET /metrics", "GET /v1/models", "POST /v1/completions"]
KNOWN = ["GET /metrics", "GET /metrics", "POST /v1/completions"]


def test_an_idle_observation_is_four_requests_the_first_time_and_three_after(backend):
    memo = ModelMemo()
    assert observe(backend, memo) == FIRST
    assert observe(backend, memo) == KNOWN
    assert observe(backend, memo) == KNOWN
    completions = [body for method, path, body, _ in backend.sent if path == "/v1/completions"]
    assert [body["model"] for body in completions] == ["tiny-llama"] * 3


def test_without_a_memo_every_probe_asks_for_the_model(backend):
    assert observe(backend, None) == FIRST
    assert observe(backend, None) == FIRST


def test_a_restarted_process_is_asked_for_its_model_again(backend):
    memo = ModelMemo()
    assert observe(backend, memo) == FIRST
    restarted = IDLE_PAGE.replace(START_LINE, b"\nprocess_start_time_seconds 1.79600900000e+09\n")
    assert restarted != IDLE_PAGE
    backend.pages["/metrics"] = Page(restarted)
    assert observe(backend, memo) == FIRST
    assert observe(backend, memo) == KNOWN


def test_a_page_without_a_start_time_is_asked_every_time(backend):
    memo = ModelMemo()
    backend.pages["/metrics"] = Page(IDLE_PAGE.replace(START_LINE, b"\n"))
    assert observe(backend, memo) == FIRST
    assert observe(backend, memo) == FIRST


def test_a_model_the_server_says_does_not_exist_is_asked_for_next_time(backend):
    memo = ModelMemo()
    assert observe(backend, memo) == FIRST
    backend.pages["/v1/completions"] = Page(NO_SUCH_MODEL, status=404, content_type="application/json",
                                            next=Page(COMPLETION, content_type="application/json"))
    backend.pages["/v1/embeddings"] = Page(NO_SUCH_MODEL, status=404, content_type="application/json")
    told = observe(backend, memo)
    assert told == KNOWN + ["POST /v1/embeddings"]  # auto: a 404 may be a pooling model's
    assert memo.model(backend.url, 1.79600807877e+09) is None
    assert observe(backend, memo) == FIRST


def test_a_pooling_models_missing_route_keeps_the_model(backend):
    """A pooling model answers /v1/completions 404 "Not Found" (no such route): the model exists."""
    memo = ModelMemo()
    backend.pages["/v1/completions"] = Page(b'{"detail":"Not Found"}', status=404, content_type="application/json")
    assert observe(backend, memo) == FIRST + ["POST /v1/embeddings"]
    assert observe(backend, memo) == KNOWN + ["POST /v1/embeddings"]
    assert observe(backend, memo, probe=PROBE_EMBEDDING) == ["GET /metrics", "GET /metrics", "POST /v1/embeddings"]


def test_every_module_takes_the_memo_so_the_exporter_can_hand_it_to_any():
    """The exporter passes ``known=`` to whichever module a scrape names; only a backend uses it."""
    from hangwatch.modules import MODULES
    for name, module in MODULES.items():
        parameter = inspect.signature(module.observe).parameters.get("known")
        assert parameter is not None and parameter.default is None, name
