"""What the tests, the demo and the benchmarks share, once, where all three may import it (not installed):

- ``wait``: ``wait_until(predicate, deadline, what)``, the one way to wait;
- ``ports``: servers bind port 0 and the port is read back from /proc; ``free_port`` only
  for servers that must be told theirs (with a retry when it was taken);
- ``processes``: a server process with its own log, its real port, stopped by PID;
- ``stack``: the one Prometheus + Alertmanager stack built from the shipped examples;
- ``receiver``: HTTP receivers that record what Alertmanager (or anything) posts to them.
"""
