"""Secret files any local user may read are refused at start-up, naming their key.

Before: a world-readable token, reset token or TLS key only logged a warning and an API key
file was not looked at; the webhook ran with secrets anyone on the machine could copy. Now each
is refused (exit 64); group-readable stays allowed, as the install guides set the token up
(0440, Alertmanager reading it through the webhook's group).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from hangwatch.settings import ConfigError
from hangwatch.webhook.config import load_token, parse_config

from . import certs as certs_module
from .real_parts import REPO

TOKEN = "proc-token-0123456789-0123456789-abc"


def target(**extra) -> dict:
    return {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9", **extra}


@pytest.mark.parametrize("mode, refused", [(0o600, False), (0o640, False), (0o440, False), (0o644, True),
                                           (0o604, True), (0o602, True)],
                         ids=lambda value: f"{value:04o}" if isinstance(value, int) and value > 1 else str(value))
def test_an_api_key_file_others_may_read_is_refused_naming_the_target(tmp_path, mode, refused):
    key = tmp_path / "vllm-api-key"
    key.write_text("sk-vllm-0123456789\n")
    key.chmod(mode)
    raw = {"targets": [target(), target(name="vllm-b", container="vllm-b", api_key_file=str(key))]}
    if not refused:
        assert parse_config(raw).targets[1].api_key == "sk-vllm-0123456789"
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert str(caught.value).startswith(f"targets[1].api_key_file: {key} is readable or writable by others "
                                        f"(mode {mode:04o})")
    assert "sk-vllm" not in str(caught.value)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return certs_module.make_certs(tmp_path_factory.mktemp("certs"))


def test_a_docker_tls_key_others_may_read_is_refused(certs, tmp_path):
    key = tmp_path / "key.pem"
    key.write_bytes(certs.client_key.read_bytes())
    tls = {**certs.tls(), "key_file": str(key)}
    raw = {"docker_hosts": {"gpu-2": {"url": "tcp://127.0.0.1:2376", "tls": tls}},
           "targets": [target(docker_host="gpu-2")]}
    key.chmod(0o640)
    assert parse_config(raw).targets[0].docker_host.tls.key_file == str(key)
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=re.escape(f"docker_hosts.gpu-2.tls.key_file: {key} is readable or "
                                                    "writable by others (mode 0644)")):
        parse_config(raw)


def documented_token_modes() -> list[tuple[str, int]]:
    """Every ``chmod MODE deploy/secrets/hangwatch-token`` an install guide tells people to run."""
    found = []
    for name in ("README.md", "deploy/README.md", "docs/existing-vllm.md", "docker-compose.yml"):
        for match in re.finditer(r"chmod (0?[0-7]{3,4}) deploy/secrets/hangwatch-token", (REPO / name).read_text()):
            found.append((name, int(match.group(1), 8)))
    return found


def test_the_token_as_the_install_guides_set_it_up_is_accepted(tmp_path):
    modes = documented_token_modes()
    assert len(modes) >= 3, modes
    token = tmp_path / "hangwatch-token"
    token.write_text(TOKEN + "\n")
    for name, mode in modes:
        token.chmod(mode)
        assert load_token(parse_config({"token_file": str(token), "targets": [target()]})) == TOKEN, name


def test_a_world_readable_token_stops_the_webhook_exit_64_naming_the_key(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"),
                                  "targets": [target()]}))
    done = subprocess.run([sys.executable, "-m", "hangwatch", "webhook", "--config", str(config),
                           "--listen", "127.0.0.1:0"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 64, done.stderr
    assert f"token_file: {token} is readable or writable by others (mode 0644)" in done.stderr
    assert TOKEN not in done.stderr + done.stdout
