"""The real-llama.cpp tier: one real llama-server (CPU, random 440 MB model) for this package.

Package scope: it starts with the package's first test and stops after its last, so it does
not compete for the two cores with other tiers' timing tests. Built by
``.ci/setup-llamacpp.sh``. Missing build: a failure in CI, a skip elsewhere.
"""
import pytest

from tests.real_llamacpp.llamacpp_server import LlamaServer, installed, model_path, server_binary
from tests.support.require import require


@pytest.fixture(scope="package")
def real_llamacpp():
    """A started :class:`LlamaServer` (``-np 4 -c 4096``, unified KV, 4096-token batches),
    stopped by PID (thawed first) after the package's last test whatever happens."""
    require(installed(), f"llama-server at {server_binary()} and model {model_path()} "
                         "(make them with .ci/setup-llamacpp.sh)")
    server = LlamaServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def llamacpp(real_llamacpp):
    """The package's server, thawed and with nothing in flight, before and after the test."""
    real_llamacpp.thaw()
    real_llamacpp.wait_idle()
    try:
        yield real_llamacpp
    finally:
        real_llamacpp.thaw()
