"""Run a coroutine on a stock asyncio loop or on uvloop: the client must end every request
alike on both (the exporter runs uvloop where it installs, the CLI stock asyncio)."""
from __future__ import annotations

import asyncio

import pytest
import uvloop

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request):
    """``run(coroutine)``: its result, on a fresh loop of the parametrized kind."""
    def run(coroutine):
        loop = LOOPS[request.param]()
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
    run.kind = request.param
    return run
