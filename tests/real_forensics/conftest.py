"""A real vLLM (CPU) with the ``wedge`` fault loaded (tests/vllm_faults), for the forensics tests.

Its own package: the server carries the fault plugin on PYTHONPATH, so it is not the real tier's
shared server, and it starts only when these tests run (stopped after the last of them).
"""
import os

import pytest

from harness.vllm_server import VLLMServer, venv_path, venv_usable
from tests.support.require import require

# What the wedged EngineCore says first (vllm#51921's line): the chain test's webhook reads it.
SAYS = "[shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds."
FAULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vllm_faults")


@pytest.fixture(scope="package")
def wedgeable_vllm(tmp_path_factory):
    """A started VLLMServer whose EngineCore wedges in ``hangwatch_fault_wedged_here`` once
    ``server.wedge_trigger`` (a path) exists."""
    require(venv_usable(), f"vLLM venv at {venv_path()} (make it with .ci/setup-vllm.sh)")
    trigger = str(tmp_path_factory.mktemp("wedge") / "now")
    server = VLLMServer(extra_env={"PYTHONPATH": FAULTS, "HANGWATCH_VLLM_FAULT": "wedge",
                                   "HANGWATCH_WEDGE_TRIGGER": trigger, "HANGWATCH_WEDGE_SAYS": SAYS})
    server.wedge_trigger = trigger
    try:
        server.start()
        yield server
    finally:
        server.close()
