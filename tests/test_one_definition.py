"""Each concept the exporter and the webhook share is defined once, in the core (issue 27).

These fail when a second copy comes back: a face keeping its own module table, its own
per-target validator, or its own idea of when the engine's version is asked.
"""
from __future__ import annotations

import asyncio

import pytest

from hangwatch import modules
from hangwatch.client import Fetched
from hangwatch.deadline import Deadline
from hangwatch.demo.files import private_file
from hangwatch.engines import ENGINES
from hangwatch.exporter.collector import BackendCollector
from hangwatch.exporter.config import exporter_config
from hangwatch.observation import BROKEN, OK, Observation
from hangwatch.observe import engine_version
from hangwatch.reading import Reading
from hangwatch.settings import ConfigError
from hangwatch.target_options import TargetOptions
from hangwatch.webhook import config as webhook_config

WEBHOOK_TARGET = {"name": "a", "container": "a", "url": "http://127.0.0.1:8000"}


def test_every_face_looks_modules_up_in_the_one_table():
    import hangwatch.check
    import hangwatch.cli
    from hangwatch.exporter import prober, query
    assert webhook_config.MODULES is modules.MODULES
    assert query.MODULES is modules.MODULES and prober.MODULES is modules.MODULES
    assert hangwatch.cli.MODULES is modules.MODULES
    assert not hasattr(modules, "NAMES") and not hasattr(hangwatch.check, "MODULES")


def test_the_exporter_and_the_webhook_read_a_target_into_the_same_type(tmp_path):
    key = private_file(tmp_path / "key", "secret-key\n")
    exporter = exporter_config({"targets": [{"url": "http://127.0.0.1:8000", "api_key_file": str(key),
                                             "probe": "embedding", "module": "fastchat_worker"}]}).targets[0]
    webhook = webhook_config.parse_config({"targets": [dict(WEBHOOK_TARGET, api_key_file=str(key), probe="embedding",
                                                            module="fastchat_worker")]}, env={}).targets[0]
    assert type(exporter) is type(webhook.read) is TargetOptions
    assert exporter == webhook.read
    assert (webhook.url, webhook.module, webhook.api_key, webhook.probe) == (
        exporter.url, exporter.module, exporter.api_key, exporter.probe)
    assert "secret-key" not in repr(exporter) + repr(webhook)


@pytest.mark.parametrize("key, value", [("probe", "sometimes"), ("module", "tgi"), ("url", "ftp://x")])
def test_a_bad_shared_key_is_refused_alike_by_both_faces_naming_it(key, value):
    with pytest.raises(ConfigError) as exporter:
        exporter_config({"targets": [{"url": "http://127.0.0.1:8000", key: value}]})
    with pytest.raises(ConfigError) as webhook:
        webhook_config.parse_config({"targets": [dict(WEBHOOK_TARGET, **{key: value})]}, env={})
    assert str(exporter.value).startswith(f"targets[0].{key}: ")
    assert str(exporter.value) == str(webhook.value)


class _CountingClient:
    def __init__(self):
        self.asked: list[str] = []

    async def request(self, method, url, **kwargs):
        self.asked.append(url)
        return Fetched(BROKEN, error="not here")


@pytest.mark.parametrize("seconds", [5.0, 0.04, -1.0], ids=["time-left", "too-little", "expired"])
@pytest.mark.parametrize("engine", [spec.name for spec in ENGINES] + ["unknown"])
def test_the_loop_hands_off_exactly_when_the_version_would_be_asked(engine, seconds):
    """The loop's "a worker must ask the version" and ``engine_version`` asking are one rule:
    if they disagreed, the loop would block on a request or leave the version out."""
    observation = Observation(0.0, OK, reading=Reading(engine, 1.0, 0.0))
    deadline = Deadline.after(seconds)
    collector = BackendCollector("http://127.0.0.1:8000", "backend", 5.0)
    asks = collector.version_asks(observation, deadline, None)
    client = _CountingClient()
    asyncio.run(engine_version(client, "http://127.0.0.1:8000", engine, deadline, collector.options))
    assert asks == bool(client.asked)
    assert not collector.version_asks(observation, deadline, "0.32.0")  # known: never asked again
