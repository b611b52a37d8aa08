"""The EngineCore wedges inside one named function, so a capture can be checked against it.

``install()`` wraps ``EngineCore.step`` (and ``step_with_batch_queue``) in every vLLM process;
only the EngineCore steps. Once the trigger holds, the next step calls
``hangwatch_fault_wedged_here``, which never returns: requests stay in flight, every counter
freezes, /metrics and /health keep answering — a hang as a stuck kernel or collective makes it.
The trigger: the file named by ``HANGWATCH_WEDGE_TRIGGER`` exists, or ``HANGWATCH_WEDGE_AFTER_STEPS``
steps have run (either, when both are set). ``HANGWATCH_WEDGE_SAYS``: a line the EngineCore writes
to its log (stderr) as it wedges, as vLLM does before a real stall (e.g. "No available shared memory
broadcast block found", vllm#51921), so the webhook's log catalogue can be proved on a real server.
"""
from __future__ import annotations

import functools
import os
import sys
import threading

TRIGGER_ENV = "HANGWATCH_WEDGE_TRIGGER"
AFTER_ENV = "HANGWATCH_WEDGE_AFTER_STEPS"
SAYS_ENV = "HANGWATCH_WEDGE_SAYS"


def hangwatch_fault_wedged_here() -> None:
    """Block forever (without holding the GIL), like a kernel or a collective that never completes."""
    threading.Event().wait()


def _triggered(steps: int) -> bool:
    trigger = os.environ.get(TRIGGER_ENV)
    after = os.environ.get(AFTER_ENV)
    return bool(trigger and os.path.exists(trigger)) or (after is not None and steps >= int(after))


def install() -> None:
    from vllm.v1.engine.core import EngineCore

    steps = [0]

    def wedging(step):
        @functools.wraps(step)
        def wedged_step(self, *args, **kwargs):
            if _triggered(steps[0]):
                said = os.environ.get(SAYS_ENV)
                if said:
                    print(f"(EngineCore_DP0 pid={os.getpid()}) WARNING {said}", file=sys.stderr, flush=True)
                hangwatch_fault_wedged_here()
            steps[0] += 1
            return step(self, *args, **kwargs)
        wedged_step.hangwatch_wedge = True
        return wedged_step

    for name in ("step", "step_with_batch_queue"):
        original = getattr(EngineCore, name, None)
        if original is not None and not getattr(original, "hangwatch_wedge", False):
            setattr(EngineCore, name, wedging(original))
