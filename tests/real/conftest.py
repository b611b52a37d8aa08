"""The real-vLLM tier: one real vLLM (CPU, tiny random Llama) for this package's tests.

Package scope: the server starts with the first test here and stops after the last, so it
does not compete for the machine's two cores with the later tiers' timing tests. The venv
comes from ``.ci/setup-vllm.sh`` (``HANGWATCH_VLLM_VENV``, default
/var/cache/hangwatch/vllm-venv). Missing venv: a failure in CI, a skip elsewhere.
"""
import pytest

from harness.vllm_server import VLLMServer, venv_path, venv_usable
from tests.support.require import require


@pytest.fixture(scope="package")
def real_vllm():
    """A started :class:`harness.vllm_server.VLLMServer`.

    ``.url``, ``.freeze()`` / ``.wait_frozen(running)`` / ``.thaw()`` / ``.wait_progress(page)``
    (SIGSTOP/SIGCONT of VLLM::EngineCore), ``.restart()``, ``.metrics_text()`` / ``.metrics()``
    (parsed), ``.generations(n, …)`` (N concurrent long streamed generations; a context
    manager), ``.long_prompt(n_tokens)`` (one chunked prefill), ``.wait_until(predicate,
    deadline_s)``, ``.wait_idle()``, ``.prove_healthy()``. Stopped (and thawed) after the
    package's last test whatever happens.
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
    """The package's server, thawed, with nothing in flight and proven healthy (one completion
    and fast /metrics pages) before the test, whatever ran before it (any order, ``-k``,
    ``--lf``); thawed after it."""
    real_vllm.thaw()
    real_vllm.wait_idle(60)
    real_vllm.prove_healthy()
    try:
        yield real_vllm
    finally:
        real_vllm.thaw()
