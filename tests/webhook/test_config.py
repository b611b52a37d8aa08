"""The config: the example loads; every mistake is refused with its path, before anything binds."""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from hangwatch.demo.files import private_file
from hangwatch.settings import duration as parse_duration
from hangwatch.webhook.config import ConfigError, load_config, load_reset_token, load_token, parse_config

REPO = pathlib.Path(__file__).resolve().parents[2]
GOOD_TARGET = "  - {name: vllm-a, container: vllm-a, url: 'http://127.0.0.1:8000'}\n"


def test_example_config_loads_as_documented():
    config = load_config(str(REPO / "examples" / "webhook.yml"))
    assert config.token_file == "/run/secrets/hangwatch-token"
    assert config.state_dir == "/var/lib/hangwatch" and config.dry_run is False
    assert config.alertnames == ("HangwatchBackendHung",)
    assert (config.recheck.interval, config.recheck.timeout) == (10, 5)
    assert config.cooldown == 900 and (config.budget.restarts, config.budget.window) == (3, 3600)
    a, b = config.targets
    assert (a.name, a.container, a.url, a.module, a.stop_timeout) == (
        "vllm-a", "vllm-a", "http://127.0.0.1:8000", "backend", 30)
    assert (b.module, b.stop_timeout) == ("backend", 30)


def test_defaults_are_designs():
    config = parse_config({"targets": [{"name": "a", "container": "a", "url": "http://127.0.0.1:1"}]})
    assert (config.cooldown, config.budget.restarts, config.budget.window) == (900, 3, 3600)
    assert (config.recheck.interval, config.recheck.timeout) == (10, 5)


@pytest.mark.parametrize("text, seconds", [("10s", 10), ("15m", 900), ("1h", 3600), ("500ms", 0.5), ("1.5m", 90)])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


BAD = {
    "unknown top-level key": ("cooldwn: 15m\ntargets:\n" + GOOD_TARGET, "cooldwn: unknown key"),
    "unknown target key": ("targets:\n" + GOOD_TARGET +
                           "  - {name: b, contanier: b, container: b, url: 'http://127.0.0.1:1'}\n",
                           "targets[1].contanier: unknown key"),
    "unknown nested key": ("recheck: {interval: 10s, timout: 5s}\ntargets:\n" + GOOD_TARGET, "recheck.timout: unknown key"),
    "no targets": ("cooldown: 15m\n", "targets: required"),
    "empty targets": ("targets: []\n", "targets: required"),
    "missing url": ("targets:\n  - {name: a, container: a}\n", "targets[0].url: required"),
    "bare number duration": ("cooldown: 15\ntargets:\n" + GOOD_TARGET, "cooldown: expected a duration"),
    "bad duration": ("recheck: {interval: 10 seconds}\ntargets:\n" + GOOD_TARGET, "recheck.interval: '10 seconds' is not a duration"),
    "zero interval": ("recheck: {interval: 0s}\ntargets:\n" + GOOD_TARGET, "recheck.interval: 0s is out of range"),
    "budget zero": ("budget: {restarts: 0}\ntargets:\n" + GOOD_TARGET, "budget.restarts: expected a whole number"),
    "budget string": ("budget: {restarts: 'three'}\ntargets:\n" + GOOD_TARGET, "budget.restarts: expected a whole number"),
    "dry_run string": ("dry_run: 'yes'\ntargets:\n" + GOOD_TARGET, "dry_run: expected true or false"),
    "alertnames empty": ("alertnames: []\ntargets:\n" + GOOD_TARGET, "alertnames: expected a non-empty list"),
    "alertnames not strings": ("alertnames: [1]\ntargets:\n" + GOOD_TARGET, "alertnames[0]: expected a non-empty string"),
    "duplicate name": ("targets:\n" + GOOD_TARGET + "  - {name: vllm-a, container: b, url: 'http://127.0.0.1:1'}\n",
                       "targets[1].name: 'vllm-a' is already used by targets[0]"),
    "duplicate container": ("targets:\n" + GOOD_TARGET + "  - {name: b, container: vllm-a, url: 'http://127.0.0.1:1'}\n",
                            "targets[1].container: 'vllm-a' on docker host 'default' is already used by targets[0]"),
    "url scheme": ("targets:\n  - {name: a, container: a, url: 'ftp://127.0.0.1:1'}\n", "targets[0].url: 'ftp://127.0.0.1:1' must be http(s)"),
    "url no host": ("targets:\n  - {name: a, container: a, url: 'http://'}\n", "targets[0].url:"),
    "url bad port": ("targets:\n  - {name: a, container: a, url: 'http://h:99999'}\n", "targets[0].url: 'http://h:99999' is not a URL"),
    "url credentials": ("targets:\n  - {name: a, container: a, url: 'http://u:p@h:1'}\n", "must not carry credentials"),
    "module unknown": ("targets:\n  - {name: a, container: a, url: 'http://h:1', module: tgi}\n",
                       "targets[0].module: 'tgi' is not one of backend, fastchat_api, fastchat_controller, fastchat_worker, proxy"),
    "controller never restarted": ("targets:\n  - {name: a, container: a, url: 'http://h:1', module: fastchat_controller}\n",
                                   "targets[0].module: a fastchat_controller is never restarted"),
    "proxy never restarted": ("targets:\n  - {name: a, container: a, url: 'http://h:1', module: proxy}\n",
                              "targets[0].module: a proxy is never restarted"),
    "container name": ("targets:\n  - {name: a, container: '../etc', url: 'http://h:1'}\n",
                       "targets[0].container: '../etc' is not a Docker container name"),
    "target name": ("targets:\n  - {name: 'a/b', container: a, url: 'http://h:1'}\n", "targets[0].name: 'a/b' must be"),
    "stop_timeout range": ("targets:\n  - {name: a, container: a, url: 'http://h:1', stop_timeout: 2h}\n",
                           "targets[0].stop_timeout: 2h is out of range"),
    "not a mapping": ("- 1\n", "config: expected a mapping"),
    "targets not a list": ("targets: {a: 1}\n", "targets: required"),
    "target not a mapping": ("targets: [vllm]\n", "targets[0]: expected a mapping"),
    "not yaml": ("targets: [\n", "not valid YAML"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_config_names_the_key(name, tmp_path):
    text, message = BAD[name]
    path = tmp_path / "webhook.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert message in str(caught.value)


LONG = "t" * 31 + "-long-enough"
ONE_TARGET = {"targets": [{"name": "a", "container": "a", "url": "http://h:1"}]}


def test_token_from_file_then_env(tmp_path):
    token_file = private_file(tmp_path / "token", LONG + "\n")
    config = parse_config({"token_file": str(token_file), **ONE_TARGET})
    assert load_token(config, env={"HANGWATCH_WEBHOOK_TOKEN": "other" * 10}) == LONG
    config = parse_config(ONE_TARGET)
    assert load_token(config, env={"HANGWATCH_WEBHOOK_TOKEN": LONG + "-env"}) == LONG + "-env"
    with pytest.raises(ConfigError, match=r"\$HANGWATCH_WEBHOOK_TOKEN is empty"):
        load_token(config, env={})
    token_file.write_text("\n")
    config = parse_config({"token_file": str(token_file), **ONE_TARGET})
    with pytest.raises(ConfigError, match=f"token_file: {token_file} is empty"):
        load_token(config, env={})


@pytest.mark.parametrize("source", ["file", "env"])
def test_a_token_shorter_than_32_characters_is_refused(tmp_path, source):
    short = "x" * 31
    token_file = private_file(tmp_path / "token", short)
    raw = {"token_file": str(token_file), **ONE_TARGET} if source == "file" else ONE_TARGET
    with pytest.raises(ConfigError, match="is 31 characters; at least 32 are required") as caught:
        load_token(parse_config(raw), env={"HANGWATCH_WEBHOOK_TOKEN": short})
    assert short not in str(caught.value)  # the secret is never shown
    token_file.write_text("x" * 32)
    assert load_token(parse_config(raw), env={"HANGWATCH_WEBHOOK_TOKEN": "x" * 32}) == "x" * 32


@pytest.mark.parametrize("mode, refused", [(0o600, False), (0o640, False), (0o440, False), (0o400, False),
                                           (0o644, True), (0o604, True), (0o606, True), (0o602, True)],
                         ids=lambda value: f"{value:04o}" if isinstance(value, int) and value > 1 else str(value))
@pytest.mark.parametrize("key", ["token_file", "reset_token_file"])
def test_a_token_file_others_may_read_or_write_is_refused_naming_the_key(tmp_path, mode, refused, key):
    """Before: only a warning; any local user could read the token and have a container restarted."""
    token_file, reset_file = tmp_path / "token", tmp_path / "reset"
    token_file.write_text(LONG)
    reset_file.write_text(LONG + "-reset")
    for file in (token_file, reset_file):
        file.chmod(0o600)
    (token_file if key == "token_file" else reset_file).chmod(mode)
    config = parse_config({"token_file": str(token_file), "reset_token_file": str(reset_file), **ONE_TARGET})
    if not refused:
        assert load_reset_token(config, load_token(config)) == LONG + "-reset"
        return
    with pytest.raises(ConfigError) as caught:
        load_reset_token(config, load_token(config))
    path = token_file if key == "token_file" else reset_file
    assert str(caught.value).startswith(f"{key}: {path} is readable or writable by others (mode {mode:04o})")
    assert LONG not in str(caught.value)


def test_a_separate_reset_token(tmp_path):
    token_file, reset_file = tmp_path / "token", tmp_path / "reset"
    private_file(token_file, LONG)
    private_file(reset_file, LONG + "-reset")
    config = parse_config({"token_file": str(token_file), "reset_token_file": str(reset_file), **ONE_TARGET})
    assert config.reset_token_file == str(reset_file)
    assert load_reset_token(config, load_token(config)) == LONG + "-reset"
    assert load_reset_token(parse_config({"token_file": str(token_file), **ONE_TARGET}), LONG) is None
    reset_file.write_text(LONG)
    with pytest.raises(ConfigError, match="reset_token_file: holds the same token as token_file"):
        load_reset_token(config, LONG)
    reset_file.write_text("short")
    with pytest.raises(ConfigError, match="reset_token_file: the token in .* is 5 characters"):
        load_reset_token(config, LONG)
    reset_file.unlink()
    with pytest.raises(ConfigError, match="reset_token_file: cannot read"):
        load_reset_token(config, LONG)


def test_a_short_token_stops_the_webhook_before_it_binds(tmp_path):
    token_file = private_file(tmp_path / "token", "guessable")
    path = tmp_path / "webhook.yml"
    path.write_text(f"token_file: {token_file}\nstate_dir: {tmp_path / 'state'}\ntargets:\n" + GOOD_TARGET)
    done = subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(path), "--listen",
                           "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 64
    assert "token_file: the token in" in done.stderr and "is 9 characters; at least 32" in done.stderr
    assert "guessable" not in done.stderr


def test_bad_config_exits_non_zero_naming_the_key_before_binding(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]  # if main bound before checking, it would say "cannot listen"
    path = tmp_path / "webhook.yml"
    path.write_text("targets:\n" + GOOD_TARGET + "  - {name: b, contanier: b, url: 'http://127.0.0.1:1'}\n")
    env = dict(os.environ, HANGWATCH_WEBHOOK_TOKEN="t0ken" * 8)
    done = subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(path),
                           "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, env=env, timeout=30)
    holder.close()
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["hangwatch webhook: targets[1].contanier: unknown key "
                                                "(known: api_key_file, container, docker_host, forensics_url, "
                                                "group, insecure_tcp, module, name, policy, probe, restart_on, startup_deadline, "
                                                "stop_timeout, url)"]
