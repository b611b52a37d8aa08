"""The one table of modules: what kind of target it is, how it is observed, what may be done to it.

Every caller (``hangwatch check``, the exporter, the liveness endpoint, the webhook) looks
modules up here, so a new kind of target is one row (the blackbox_exporter way). ``reads_load``:
the target reports requests in flight; ``restartable``: the webhook may ever restart it (a
proxy or a FastChat front serves many backends: those are checked and restarted instead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from . import fastchat
from .client import Client
from .deadline import Deadline
from .models_memo import ModelMemo
from .observation import Observation, Options
from .observe import observe_backend, observe_proxy

# An observer: async (client, url, deadline, options, *, clock, known, pause) -> Observation; ``known``:
# a ``ModelMemo`` the caller keeps between observations (the exporter), or None (ask every time);
# ``pause``: how an idle confirmation waits (``observe.Pause``; the exporter lends its slot out).
Observer = Callable[..., Awaitable[Observation]]


@dataclass(frozen=True)
class Module:
    name: str
    observe: Observer
    reads_load: bool
    restartable: bool
    summary: str


MODULES: dict[str, Module] = {module.name: module for module in (
    Module("backend", observe_backend, reads_load=True, restartable=True,
           summary="an engine's /metrics (vLLM, llama.cpp, SGLang, TGI); the idle probe at idle"),
    Module("proxy", observe_proxy, reads_load=False, restartable=False,
           summary="an OpenAI-compatible proxy: /v1/models only (its backends are checked directly)"),
    Module("fastchat_worker", fastchat.observe_worker, reads_load=True, restartable=True,
           summary="a FastChat model worker: /worker_get_status, /worker_generate at idle"),
    Module("fastchat_controller", fastchat.observe_controller, reads_load=False, restartable=False,
           summary="a FastChat controller: /test_connection and /list_models"),
    Module("fastchat_api", fastchat.observe_api, reads_load=False, restartable=False,
           summary="a FastChat OpenAI API server: a chat request naming no registered model"),
)}


def module(name: str) -> Module:
    try:
        return MODULES[name]
    except KeyError:
        raise ValueError(f"unknown module {name!r} (known: {', '.join(MODULES)})") from None


async def observe(name: str, client: Client, url: str, deadline: Deadline, options: Options = Options(), *,
                  clock=None, known: ModelMemo | None = None) -> Observation:
    """One observation of ``url`` with the module ``name``."""
    kwargs = {} if clock is None else {"clock": clock}
    return await module(name).observe(client, url, deadline, options, known=known, **kwargs)
