"""A fake vLLM 0.32 server that can be driven into every state hangwatch must judge.

Real vLLM needs a minute to start and cannot hang on cue, so demos, the compose ``sim`` profile
and tests use this instead: ``engine`` (the counters), ``page``/``page_source`` (the /metrics page,
rebuilt from a real page skeleton kept as data in ``pages/*.prom``), ``handler`` (HTTP),
``server`` (``Simulator``, its lifecycle and controls) and ``cli`` (``python -m hangwatch.simulator``).
"""
from .cli import main
from .page import CONTENT_TYPE_METRICS
from .server import STATES, Simulator

__all__ = ["CONTENT_TYPE_METRICS", "STATES", "Simulator", "main"]
