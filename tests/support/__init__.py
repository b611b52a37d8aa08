"""What every test tier (and ``python -m demo``) shares, once:

- ``wait``: ``wait_until(predicate, deadline, what)``, the one way to wait;
- ``ports``: servers bind port 0 and the port is read back from /proc; ``free_port`` only
  for servers that must be told theirs (with a retry when it was taken);
- ``processes``: a server process with its own log, its real port, stopped by PID;
- ``stack``: the one Prometheus + Alertmanager stack built from the shipped examples;
- ``receiver``: an Alertmanager webhook receiver that records deliveries;
- ``require``: a missing real part fails in CI and skips elsewhere (``tests/conftest.py``
  fails every other skip under CI);
- ``pages``: a tiny HTTP server answering whatever a bad-input test needs.
"""
