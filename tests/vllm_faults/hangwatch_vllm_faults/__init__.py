"""Faults injected into a real vLLM, so the metrics under test are vLLM's own.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (API server,
EngineCore, workers). This package is found through its ``.dist-info`` beside it: a server
started with this folder (``tests/vllm_faults``) on ``PYTHONPATH`` loads ``register``. It does
nothing unless ``HANGWATCH_VLLM_FAULT`` names a fault in ``FAULTS``; then that fault's module
patches vLLM in the processes it applies to. One module per fault, one row per fault here.
"""
from __future__ import annotations

import importlib
import os
import sys

ENV = "HANGWATCH_VLLM_FAULT"

# fault name -> module (in this package) whose install() patches vLLM
FAULTS: dict[str, str] = {
    "decode_dead": "decode_dead",              # (a) prompts prefilled, no token ever out
    "admission_stuck": "admission_stuck",      # (b) waiting requests deferred, never admitted
    "one_request_stuck": "one_request_stuck",  # (c) one request never finishes, others do
    "wedge": "wedge",                          # EngineCore blocks in a named function (forensics)
}


def register() -> None:
    name = os.environ.get(ENV, "").strip()
    if not name:
        return
    if name not in FAULTS:
        print(f"hangwatch_vllm_faults: unknown fault {name!r} (known: {sorted(FAULTS)})", file=sys.stderr)
        raise SystemExit(2)
    importlib.import_module(f"{__name__}.{FAULTS[name]}").install()
