"""One way to run exporters in a test: each on port 0 on its own thread, all stopped at teardown
whatever the test did (so a failed assertion never leaves a server holding a port or a thread).
A plugin (tests/conftest.py names it), so the fixture is there for every test folder."""
from __future__ import annotations

import pytest

from hangwatch.exporter.config import ExporterConfig
from tests.exporter.test_probe_endpoint import start_exporter


@pytest.fixture
def exporters():
    """``exporters(config) -> (server, url)``; every exporter it started is shut down at teardown."""
    started = []

    def start(config: ExporterConfig = ExporterConfig()):
        server, url = start_exporter(config)
        started.append(server)
        return server, url

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
