"""A fake vLLM 0.32 server that can be driven into every state hangwatch must judge.

A tool beside the product (demos, the compose ``sim`` profile, tests), not part of the
verdict core: real vLLM needs a minute to start and cannot hang on cue. Its /metrics page is
rebuilt from a real page skeleton kept as data (``pages/*.prom``). See ``fake_vllm``.
"""
from .fake_vllm import CONTENT_TYPE_METRICS, STATES, Simulator, main

__all__ = ["CONTENT_TYPE_METRICS", "STATES", "Simulator", "main"]
