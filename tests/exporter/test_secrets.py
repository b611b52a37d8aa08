"""An API key goes only where the exporter's config sends it, and a query never widens the config
(issue 23, items 6 and 7).

Measured on main before this: with a default ``api_key_file`` and no ``allow_targets``,
``/probe?target=http://127.0.0.1:<any port>`` — also via ``localhost``, ``[::ffff:127.0.0.1]``,
``/livez`` and ``module=proxy`` — sent ``Authorization: Bearer <key>`` to that port; a target set
to ``probe: none`` was probed after ``&probe=completion`` or ``&module=fastchat_api``; ``/livez``
echoed ``user:password@`` back in its 400. Real sockets on 127.0.0.1: a listener on a port the
config does not list records every request and its Authorization header.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import requests

from hangwatch.exporter.config import ConfigError, ExporterConfig, exporter_config, narrowed_probe
from hangwatch.exporter.query import Asked, Refused, asked
from tests.exporter.test_probe_endpoint import samples
from tests.support.pages import PageServer
from tests.test_hostile_backends import idle_vllm

KEY = "sk-secret-0123456789abcdef"
PASSWORD = "hunter2-pw"
# What the idle probe or another module sends beyond reading load: none of it may reach a
# target set to probe: none, and no Authorization may reach a URL the config does not list.
PROBE_PATHS = {"/v1/completions", "/v1/embeddings", "/v1/chat/completions", "/worker_generate"}


@pytest.fixture
def listener():
    """An idle vLLM on a port no config lists: it records every request and its Authorization."""
    server = PageServer()
    idle_vllm(server)
    yield server
    server.stop()


@pytest.fixture
def configured():
    """The one backend the config lists."""
    server = PageServer()
    idle_vllm(server)
    yield server
    server.stop()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    return str(path)


@pytest.fixture
def exporter(exporters):
    return lambda config: exporters(config)[1]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# A bounded check that ends quickly against an idle backend (ExporterConfig is built directly,
# so the budget rule of the loader does not apply).
FAST_LIVENESS = {"liveness_interval": 0.1, "liveness_timeout": 1.0, "liveness_budget": 4.0}


def bypasses(port: int) -> list[tuple[str, dict]]:
    """Every way the issue found to point the exporter at ``port``."""
    return [
        ("/probe", {"target": f"http://127.0.0.1:{port}"}),
        ("/probe", {"target": f"http://localhost:{port}"}),
        ("/probe", {"target": f"http://[::ffff:127.0.0.1]:{port}"}),
        ("/probe", {"target": f"http://127.0.0.1:{port}", "probe": "completion"}),
        ("/probe", {"target": f"http://127.0.0.1:{port}", "module": "proxy"}),
        ("/probe", {"target": f"http://127.0.0.1:{port}", "module": "fastchat_api"}),
        ("/livez", {"target": f"http://127.0.0.1:{port}"}),
        ("/readyz", {"target": f"http://localhost:{port}", "module": "proxy"}),
    ]


def ask(url: str, path: str, params: dict) -> requests.Response:
    return requests.get(url + path, params=params, timeout=30)


# -- a default key needs allow_targets --------------------------------------------------------------
def test_a_default_key_without_allow_targets_is_refused_naming_the_key(key_file):
    for data in ({"api_key_file": key_file}, {"api_key_file": key_file, "allow_any_target": True},
                 {"api_key_file": key_file, "targets": [{"url": "http://127.0.0.1:8000"}]}):
        with pytest.raises(ConfigError) as info:
            exporter_config(data)
        assert str(info.value).startswith("api_key_file: ") and "allow_targets" in str(info.value)
        assert KEY not in str(info.value)


def test_a_default_key_with_allow_targets_and_a_per_target_key_alone_still_load(key_file):
    listed = exporter_config({"api_key_file": key_file, "allow_targets": ["http://127.0.0.1:8000"]})
    assert listed.options_for("http://127.0.0.1:8000").api_key == KEY
    own = exporter_config({"targets": [{"url": "http://127.0.0.1:8000", "api_key_file": key_file}]})
    assert own.options_for("http://127.0.0.1:8000").api_key == KEY


def test_the_command_exits_64_naming_the_key_before_it_listens(tmp_path, key_file):
    config = tmp_path / "exporter.yml"
    config.write_text(f"api_key_file: {key_file}\n")
    done = subprocess.run([sys.executable, "-m", "hangwatch", "exporter", "--config", str(config),
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 64, done.stderr
    assert "api_key_file:" in done.stderr and "allow_targets" in done.stderr
    assert KEY not in done.stdout + done.stderr


# -- the key never reaches a port the config does not list ------------------------------------------
def test_a_default_key_never_reaches_an_unlisted_port_by_any_bypass(exporter, listener):
    """Built directly (the loader refuses this config): even then the default key goes to
    allow_targets only, and there are none."""
    url = exporter(ExporterConfig(api_key=KEY, **FAST_LIVENESS))
    for path, params in bypasses(port_of(listener.url)):
        answer = ask(url, path, params)
        assert answer.status_code in (200, 503, 403), (path, params, answer.status_code, answer.text)
        assert KEY not in answer.text
    assert listener.sent, "the bypasses reached the listener (else this test proves nothing)"
    assert {auth for _, _, _, auth in listener.sent} == {None}, listener.sent


def test_a_listed_backend_gets_the_default_key_and_an_unlisted_port_nothing(exporter, listener, configured,
                                                                             key_file):
    config = exporter_config({"api_key_file": key_file, "allow_targets": [configured.url]})
    url = exporter(replace(config, **FAST_LIVENESS))
    for path, params in bypasses(port_of(listener.url)):
        answer = ask(url, path, params)
        assert answer.status_code == 403, (path, params, answer.text)
    assert listener.sent == []
    answer = ask(url, "/probe", {"target": configured.url})
    assert answer.status_code == 200 and KEY not in answer.text
    assert {auth for _, _, _, auth in configured.sent} == {f"Bearer {KEY}"}  # where it belongs, every request


def test_a_targets_own_key_goes_to_its_exact_url_only(exporter, listener, configured, key_file):
    config = exporter_config({"targets": [{"url": configured.url, "api_key_file": key_file}]})
    url = exporter(replace(config, **FAST_LIVENESS))
    elsewhere = bypasses(port_of(listener.url))
    # The configured port under another name is another URL: no key either.
    same_port = [("/probe", {"target": configured.url.replace("127.0.0.1", "localhost")}),
                 ("/probe", {"target": configured.url.replace("127.0.0.1", "[::ffff:127.0.0.1]")})]
    for path, params in elsewhere + same_port:
        answer = ask(url, path, params)
        assert KEY not in answer.text
    assert listener.sent and {auth for _, _, _, auth in listener.sent} == {None}
    assert {auth for _, _, _, auth in configured.sent} <= {None}
    assert ask(url, "/probe", {"target": configured.url}).status_code == 200
    assert f"Bearer {KEY}" in {auth for _, _, _, auth in configured.sent}


# -- a query narrows the config, never widens it -----------------------------------------------------
@pytest.mark.parametrize("params", [{"probe": "completion"}, {"probe": "auto"}, {"probe": "embedding"}, {}])
def test_probe_none_stays_none_whatever_the_query_says(exporter, configured, key_file, params):
    url = exporter(exporter_config({"targets": [{"url": configured.url, "api_key_file": key_file,
                                                 "probe": "none"}]}))
    answer = ask(url, "/probe", {"target": configured.url, **params})
    assert answer.status_code == 200, answer.text
    assert samples(answer.text)[("hangwatch_up", ())] == 1
    assert not {path for _, path, _, _ in configured.sent} & PROBE_PATHS, configured.sent


@pytest.mark.parametrize("endpoint", ["/probe", "/livez", "/readyz"])
@pytest.mark.parametrize("module", ["fastchat_api", "proxy", "fastchat_worker", "fastchat_controller"])
def test_a_module_the_target_is_not_configured_for_is_403_and_sends_nothing(exporter, configured, key_file,
                                                                            endpoint, module):
    url = exporter(exporter_config({"targets": [{"url": configured.url, "api_key_file": key_file,
                                                 "probe": "none"}]}))
    answer = ask(url, endpoint, {"target": configured.url, "module": module})
    assert answer.status_code == 403, answer.text
    assert "targets[].module" in answer.text
    assert configured.sent == []


def test_a_query_may_turn_a_configured_probe_off(exporter, configured):
    url = exporter(exporter_config({"targets": [{"url": configured.url, "probe": "completion"}]}))
    assert ask(url, "/probe", {"target": configured.url, "probe": "none"}).status_code == 200
    assert not {path for _, path, _, _ in configured.sent} & PROBE_PATHS
    assert ask(url, "/probe", {"target": configured.url, "probe": "embedding"}).status_code == 200
    paths = [path for _, path, _, _ in configured.sent]
    assert "/v1/completions" in paths and "/v1/embeddings" not in paths  # completion stays completion


def test_a_query_without_module_reads_the_target_with_its_configured_one(exporter, configured):
    url = exporter(exporter_config({"targets": [{"url": configured.url, "module": "proxy"}]}))
    counted = proxy_probes_answered(url)
    answer = ask(url, "/probe", {"target": configured.url})
    assert answer.status_code == 200
    assert 'module="proxy"' in answer.text
    assert proxy_probes_answered(url) == counted + 1  # counted under the module it was read with
    assert [path for _, path, _, _ in configured.sent] == ["/v1/models"]
    assert ask(url, "/probe", {"target": configured.url, "module": "proxy"}).status_code == 200
    assert ask(url, "/probe", {"target": configured.url, "module": "backend"}).status_code == 403


def proxy_probes_answered(url: str) -> float:
    own = samples(requests.get(url + "/metrics", timeout=10).text)
    return own.get(("hangwatch_exporter_probes_total", (("code", "200"), ("module", "proxy"))), 0.0)


@pytest.mark.parametrize("configured_kind, query, kind", [
    ("auto", None, "auto"), ("auto", "completion", "completion"), ("auto", "embedding", "embedding"),
    ("auto", "none", "none"), ("none", "completion", "none"), ("none", "auto", "none"),
    ("none", "embedding", "none"), ("completion", "embedding", "completion"), ("completion", "auto", "completion"),
    ("completion", "none", "none"), ("embedding", "completion", "embedding"), ("embedding", None, "embedding"),
])
def test_the_probe_kind_is_only_ever_narrowed(configured_kind, query, kind):
    assert narrowed_probe(configured_kind, query) == kind


def test_an_unknown_targets_module_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^targets\[0\]\.module: 'bakend' is not one of backend"):
        exporter_config({"targets": [{"url": "http://a:1", "module": "bakend"}]})


# -- one validator: the same answer from every route, and no secret echoed ---------------------------
BAD_QUERIES = [
    {},
    {"target": "ftp://x"},
    {"target": "nonsense"},
    {"target": "http://127.0.0.1:1", "module": "nope"},
    {"target": "http://127.0.0.1:1", "probe": "nope"},
    {"target": "http://127.0.0.1:1/admin"},
    {"target": f"http://user:{PASSWORD}@127.0.0.1:1"},
    {"target": f"https://{PASSWORD}@127.0.0.1:1/x"},
    {"target": f"ftp://user:{PASSWORD}@host"},
    {"target": f"user:{PASSWORD}@host:1"},
    {"target": f"http://127.0.0.1:1/?token={PASSWORD}"},
    {"target": f"http://127.0.0.1:1#{PASSWORD}"},
    {"target": f"http://127.0.0.1:1\t{PASSWORD}"},
]


@pytest.mark.parametrize("params", BAD_QUERIES, ids=range(len(BAD_QUERIES)))
def test_every_route_refuses_a_bad_query_alike_and_echoes_no_secret(exporter, params):
    url = exporter(ExporterConfig())
    answers = {path: ask(url, path, params) for path in ("/probe", "/livez", "/readyz")}
    assert {answer.status_code for answer in answers.values()} == {400}, {p: a.text for p, a in answers.items()}
    assert len({answer.text for answer in answers.values()}) == 1, {p: a.text for p, a in answers.items()}
    assert PASSWORD not in answers["/livez"].text


def test_the_validator_reads_the_target_module_and_options():
    config = exporter_config({"allow_targets": ["http://vllm:8000", "http://vllm:8000/base"],
                              "targets": [{"url": "http://vllm:8000", "probe": "none", "module": "backend"}]})
    read = asked("target=http://vllm:8000/&probe=completion", config)
    assert isinstance(read, Asked) and (read.target, read.module, read.options.probe) == (
        "http://vllm:8000", "backend", "none")
    assert asked("target=http://vllm:8000/base", config) == Asked("http://vllm:8000/base", "backend",
                                                                   config.options_for("http://vllm:8000/base"))
    assert asked("target=http://other:8000", config) == Refused(403, "target is not in the exporter's allow_targets")
    assert asked("target=http://vllm:8000&module=proxy", config).code == 403
    assert asked("target=http://vllm:8000&target=http://vllm:8000", config).code == 400


def test_a_config_url_error_never_shows_the_password():
    for value in (f"http://user:{PASSWORD}@h:1", f"ftp://u:{PASSWORD}@h", f"u:{PASSWORD}@h:1",
                  f"http://u:{PASSWORD}@h:99999"):
        with pytest.raises(ConfigError) as info:
            exporter_config({"allow_targets": [value]})
        assert PASSWORD not in str(info.value) and str(info.value).startswith("allow_targets[0]: ")
