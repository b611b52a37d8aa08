"""What the tests and the benchmarks share, once, where both may import it (not installed):

- ``stack``: the Prometheus + Alertmanager chain (``hangwatch.demo.chain``) and the waits tests
  make on what it recorded;
- ``ports``: ``free_port`` only for servers that must be told theirs (with a retry when it was
  taken), ``closed_port`` for a refused connection;
- ``vllm_server`` + ``tinymodel``: a real CPU vLLM; ``engine_pages``: SGLang/TGI pages;
  ``alert_payloads``: Alertmanager payloads.

What the demo needs too is installed with it (``hangwatch.demo``): ``wait`` (``wait_until``, the
one way to wait), ``processes`` (a server process with its own log, its real port, stopped by PID),
``files`` (a private secret file), ``receiver`` (records what Alertmanager posts) and ``chain``.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: tests and benchmarks run from one
