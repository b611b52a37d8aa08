"""What only the tests share (the rest is in the top-level ``harness`` package, shared with demo/ and bench/):

- ``require``: a missing real part fails in CI and skips elsewhere (``tests/conftest.py``
  fails every other skip under CI);
- ``pages``: a tiny HTTP server answering whatever a bad-input test needs;
- ``hostile``, ``servers``, ``kubectl``, ``wheel``: misbehaving servers, hangwatch server processes,
  the pinned kubectl, the built wheel;
- ``stopped``: SIGSTOP a process and wait until every thread of it has stopped.
"""
