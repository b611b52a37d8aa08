"""FastChat modules against fake servers that answer as fschat 0.2.36 was measured to answer.

What matters here is what is *sent*: a worker is asked for one token only when its queue is
empty, the controller only ``/test_connection`` and ``/list_models``, the API server only a
chat request naming a model that cannot exist — never ``/v1/models``,
``/get_worker_address`` or the controller's ``/worker_get_status`` (docs/fleets.md). The real
deployment is in tests/real_fastchat/.
"""
import asyncio
import json
import subprocess
import sys

import pytest

from hangwatch import fastchat
from hangwatch.check import check
from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.engines import ENGINES, ENGINES_BY_NAME
from hangwatch.modules import MODULES
from tests.exporter.test_probe_endpoint import exporter, probe, samples  # noqa: F401  (fixture)
from tests.support.pages import Page, PageServer, closed_port

JSON = "application/json"
# Answers captured from a real fschat 0.2.36 deployment (tests/real_fastchat/fleet.py).
STATUS_IDLE = b'{"model_names":["tiny-vicuna"],"speed":1,"queue_length":0}'
STATUS_BUSY = b'{"model_names":["tiny-vicuna"],"speed":1,"queue_length":3}'
GENERATE_OK = (b'{"text":"w871","error_code":0,"usage":{"prompt_tokens":1,"completion_tokens":0,'
               b'"total_tokens":1},"finish_reason":"length","logprobs":null}')
GENERATE_OOM = b'{"text":"**NETWORK ERROR DUE TO HIGH TRAFFIC.**","error_code":50002}'
API_UNKNOWN_MODEL = (b'{"object":"error","message":"Only tiny-vicuna&&other allowed now, '
                     b'your model hangwatch,no-such-model","code":40301}')
API_NO_MODELS = b'{"object":"error","message":"Only  allowed now, your model hangwatch,no-such-model","code":40301}'
API_VALIDATION = b'{"object":"error","message":"1 validation error","code":40001}'


@pytest.fixture
def server():
    s = PageServer()
    yield s
    s.stop()


def observe(module, url, timeout=5.0):
    return asyncio.run(MODULES[module].observe(Client(), url, Deadline.after(timeout), clock=lambda: 0.0))


def no_sleep(_):
    pass


# --- the registry -------------------------------------------------------------------------

def test_fastchat_modules_are_registered_for_check_and_exporter():
    for module in ("fastchat_worker", "fastchat_controller", "fastchat_api"):
        assert module in MODULES
    assert not MODULES["fastchat_controller"].restartable and not MODULES["fastchat_api"].restartable
    assert MODULES["fastchat_worker"].restartable
    assert MODULES["fastchat_worker"].reads_load


def test_no_page_is_ever_detected_as_fastchat():
    assert "fastchat" in ENGINES_BY_NAME
    assert ENGINES_BY_NAME["fastchat"] not in ENGINES
    assert ENGINES_BY_NAME["fastchat"].progress == ()


# --- worker -------------------------------------------------------------------------------

def test_idle_worker_is_asked_for_one_token_straight(server):
    server.pages["/worker_get_status"] = Page(STATUS_IDLE, content_type=JSON)
    server.pages["/worker_generate"] = Page(GENERATE_OK, content_type=JSON)
    result = check(server.url, module="fastchat_worker", sleep=no_sleep)
    assert result.verdict.state == "idle"
    assert result.probe_sent
    # the status read twice (nothing in flight either time: hangwatch.observe.IDLE_CONFIRM_S), then one token
    assert [(m, p) for m, p, _, _ in server.sent] == [("POST", "/worker_get_status")] * 2 + [("POST", "/worker_generate")]
    body = server.sent[2][2]
    assert body["max_new_tokens"] == 1 and body["temperature"] == 0
    reading = result.last_reading
    assert (reading.engine, reading.in_flight, reading.models) == ("fastchat", 0, ("tiny-vicuna",))


def test_busy_worker_is_never_probed_and_never_hung(server):
    server.pages["/worker_get_status"] = Page(STATUS_BUSY, content_type=JSON)
    observations = []
    for _ in range(20):  # the queue never moves: still only "busy, unverified"
        result = check(server.url, module="fastchat_worker", sleep=no_sleep)
        observations.extend(result.observations)
        assert result.verdict.state == "busy"
        assert "unverified" in result.verdict.reason and "never restarted" in result.verdict.reason
        assert result.exit_code == 0
    assert {p for _, p, _, _ in server.sent} == {"/worker_get_status"}
    assert not any(o.probe for o in observations)


def test_worker_accepting_but_silent_twice_is_hung(server):
    server.pages["/worker_get_status"] = Page(silent=True)
    once = observe("fastchat_worker", server.url, timeout=0.3)
    assert once.status == "timeout"
    result = check(server.url, module="fastchat_worker", timeout=0.3, sleep=no_sleep)
    assert result.verdict.state == "hung"
    assert len(result.observations) == 2
    assert result.exit_code == 1


def test_refused_worker_is_down():
    result = check(f"http://127.0.0.1:{closed_port()}", module="fastchat_worker", sleep=no_sleep)
    assert result.verdict.state == "down"
    assert result.exit_code == 2


def test_idle_worker_failing_its_probe_twice_is_hung(server):
    server.pages["/worker_get_status"] = Page(STATUS_IDLE, content_type=JSON)
    server.pages["/worker_generate"] = Page(GENERATE_OOM, content_type=JSON)
    result = check(server.url, module="fastchat_worker", sleep=no_sleep)
    assert result.verdict.state == "hung"
    assert "error_code 50002" in result.verdict.reason


@pytest.mark.parametrize("body", [b"not json", b'{"queue_length": -1, "model_names": []}',
                                  b'{"queue_length": "3", "model_names": []}',
                                  b'{"queue_length": 1, "model_names": "tiny"}', b'["x"]'])
def test_worker_status_that_is_not_fastchat_is_blind_and_not_probed(server, body):
    server.pages["/worker_get_status"] = Page(body, content_type=JSON)
    observation = observe("fastchat_worker", server.url)
    assert observation.status == "blind"
    assert observation.probe is None


def test_a_vllm_server_checked_as_a_worker_is_blind(server):
    observation = observe("fastchat_worker", server.url)  # 404 on /worker_get_status
    assert observation.status == "blind"
    assert "not a FastChat model worker" in observation.error


# --- controller ---------------------------------------------------------------------------

def test_controller_is_asked_only_test_connection_and_list_models(server):
    server.pages["/test_connection"] = Page(b'"success"', content_type=JSON)
    server.pages["/list_models"] = Page(b'{"models":["tiny-vicuna","b"]}', content_type=JSON)
    result = check(server.url, module="fastchat_controller", sleep=no_sleep)
    assert result.verdict.state == "idle"
    assert "2 model(s) registered: b, tiny-vicuna" in result.verdict.reason
    assert [(m, p) for m, p, _, _ in server.sent] == [("GET", "/test_connection"), ("POST", "/list_models")]
    assert result.as_json()["models"] == ["b", "tiny-vicuna"]
    assert result.as_json()["probe_sent"] is False


def test_controller_without_workers_answers_with_no_models(server):
    server.pages["/test_connection"] = Page(b'"success"', content_type=JSON)
    server.pages["/list_models"] = Page(b'{"models":[]}', content_type=JSON)
    result = check(server.url, module="fastchat_controller", sleep=no_sleep)
    assert result.verdict.state == "idle"
    assert "0 model(s) registered: none" in result.verdict.reason


def test_controller_refused_is_down_and_silent_is_not_answering(server):
    assert check(f"http://127.0.0.1:{closed_port()}", module="fastchat_controller",
                 sleep=no_sleep).verdict.state == "down"
    server.pages["/test_connection"] = Page(silent=True)
    assert observe("fastchat_controller", server.url, timeout=0.3).status == "timeout"


def test_something_else_checked_as_a_controller_is_blind(server):
    server.pages["/test_connection"] = Page(b"ok")
    assert observe("fastchat_controller", server.url).status == "blind"


# --- API server ---------------------------------------------------------------------------

def test_api_server_is_asked_one_chat_request_naming_an_impossible_model(server):
    server.pages["/v1/chat/completions"] = Page(API_UNKNOWN_MODEL, status=400, content_type=JSON)
    result = check(server.url, module="fastchat_api", sleep=no_sleep)
    assert result.verdict.state == "idle"
    assert [(m, p) for m, p, _, _ in server.sent] == [("POST", "/v1/chat/completions")]
    model = server.sent[0][2]["model"]
    assert "," in model  # FastChat splits --model-names on commas: no worker can serve it
    assert result.as_json()["models"] == ["other", "tiny-vicuna"]


def test_api_server_with_no_registered_model_still_answers(server):
    server.pages["/v1/chat/completions"] = Page(API_NO_MODELS, status=400, content_type=JSON)
    observation = observe("fastchat_api", server.url)
    assert observation.status == "ok" and observation.listed_models == ()


def test_api_server_that_cannot_reach_its_controller_is_blind(server):
    server.pages["/v1/chat/completions"] = Page(b"Internal Server Error", status=500)
    observation = observe("fastchat_api", server.url)
    assert observation.status == "blind"
    assert "controller" in observation.error


def test_api_server_with_api_keys_answers_without_a_model_list(server):
    server.pages["/v1/chat/completions"] = Page(b'{"detail":{"error":{"code":"invalid_api_key"}}}',
                                                status=401, content_type=JSON)
    observation = observe("fastchat_api", server.url)
    assert observation.status == "ok" and observation.listed_models is None


@pytest.mark.parametrize("page", [Page(API_VALIDATION, status=400, content_type=JSON),
                                  Page(b'{"choices":[]}', content_type=JSON), Page(b"nope", status=404)])
def test_something_else_checked_as_an_api_server_is_blind(server, page):
    server.pages["/v1/chat/completions"] = page
    assert observe("fastchat_api", server.url).status == "blind"


def test_api_model_list_parsing():
    assert fastchat.api_models("Only a&&b allowed now, your model x") == ("a", "b")
    assert fastchat.api_models("Only  allowed now, your model x") == ()
    assert fastchat.api_models("something else") is None


# --- through the exporter and the command line ---------------------------------------------

def test_exporter_series_for_a_busy_worker(exporter, server):  # noqa: F811
    server.pages["/worker_get_status"] = Page(STATUS_BUSY, content_type=JSON)
    got = samples(probe(exporter, server.url, "fastchat_worker").text)
    assert got[("hangwatch_up", ())] == 1
    assert got[("hangwatch_metrics_available", ())] == 1
    assert got[("hangwatch_requests_in_flight", ())] == 3
    assert got[("hangwatch_model_served", (("model", "tiny-vicuna"),))] == 1
    assert got[("hangwatch_backend_info", (("engine", "fastchat"), ("models", "tiny-vicuna"),
                                           ("module", "fastchat_worker"), ("version", "")))] == 1
    # No progress counter is faked, and nothing but the status was asked.
    faked = ("hangwatch_engine_steps", "hangwatch_engine_tokens", "hangwatch_prefix_cache", "hangwatch_requests_finished",
             "hangwatch_kv_cache", "hangwatch_probe_success", "hangwatch_probe_duration")
    assert not any(name.startswith(faked) for name, _ in got)
    assert got[("hangwatch_probe_failed", ())] == 0  # busy: no probe sent, so none failed
    assert server.requests == [("POST", "/worker_get_status")]


def test_exporter_series_for_a_controller(exporter, server):  # noqa: F811
    server.pages["/test_connection"] = Page(b'"success"', content_type=JSON)
    server.pages["/list_models"] = Page(b'{"models":["tiny-vicuna"]}', content_type=JSON)
    got = samples(probe(exporter, server.url, "fastchat_controller").text)
    assert got[("hangwatch_up", ())] == 1
    assert got[("hangwatch_fleet_models_registered", ())] == 1
    assert got[("hangwatch_fleet_model_registered", (("model", "tiny-vicuna"),))] == 1
    assert ("hangwatch_metrics_available", ()) not in got
    assert sorted(server.requests) == [("GET", "/test_connection"), ("POST", "/list_models")]  # these, in any order


def test_cli_checks_a_worker_with_json(server):
    server.pages["/worker_get_status"] = Page(STATUS_BUSY, content_type=JSON)
    done = subprocess.run([sys.executable, "-m", "hangwatch", "check", server.url, "--module", "fastchat_worker",
                           "--json", "--interval", "0.1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["verdict"], answer["module"], answer["engine"], answer["in_flight"], answer["probe_sent"]) == \
        ("busy", "fastchat_worker", "fastchat", 3, False)
