"""What only the tests share (the rest is in the top-level ``harness`` package, shared with demo/ and bench/):

- ``require``: a missing real part fails in CI and skips elsewhere (``tests/conftest.py``
  fails every other skip under CI);
- ``pages``: a tiny HTTP server answering whatever a bad-input test needs;
- ``hostile``, ``servers``, ``kubectl``, ``wheel``: misbehaving servers, hangwatch server processes,
  the pinned kubectl, the built wheel.

``wait``, ``ports``, ``processes``, ``stack`` and ``receiver`` here are the ``harness`` modules under their
old names, for tests that still import them from here.
"""
import sys

import harness.ports
import harness.processes
import harness.receiver
import harness.stack
import harness.wait

for _module in (harness.ports, harness.processes, harness.receiver, harness.stack, harness.wait):
    _name = _module.__name__.rsplit(".", 1)[1]
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module
