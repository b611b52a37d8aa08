"""The real-vLLM tier: one real vLLM (CPU, tiny random Llama) for the whole session.

The venv comes from ``.ci/setup-vllm.sh`` (``HANGWATCH_VLLM_VENV``, default
/var/cache/hangwatch/vllm-venv). Missing venv: a failure in CI, a skip elsewhere.
"""
import pytest

from tests.support.require import require
from tests.real.vllm_server import VLLMServer, venv_path, venv_usable


@pytest.fixture(scope="session")
def real_vllm():
    """A started :class:`tests.real.vllm_server.VLLMServer`.

    ``.url``, ``.freeze()`` / ``.thaw()`` (SIGSTOP/SIGCONT of VLLM::EngineCore),
    ``.restart()``, ``.metrics_text()`` / ``.metrics()`` (parsed), ``.generations(n, …)``
    (N concurrent long streamed generations; a context manager), ``.long_prompt(n_tokens)``
    (one chunked prefill), ``.wait_until(predicate, deadline_s)``, ``.wait_idle()``.
    Stopped (and thawed) at the end of the session whatever happens.
    """
    require(venv_usable(), f"vLLM venv at {venv_path()} (make it with .ci/setup-vllm.sh)")
    server = VLLMServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def vllm(real_vllm):
    """The session's server, thawed and with nothing in flight, before and after the test."""
    real_vllm.thaw()
    real_vllm.wait_idle(60)
    try:
        yield real_vllm
    finally:
        real_vllm.thaw()
