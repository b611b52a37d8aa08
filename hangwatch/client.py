"""TEMPORARY (branch core): the async client's contract over the thread client, until the real
``hangwatch.client`` (httptools on the loop) replaces this file at the merge."""
from __future__ import annotations

import asyncio

from .fetch import MAX_ERROR_BODY, MAX_PAGE_BYTES, USER_AGENT, Fetched
from .fetch import Client as _ThreadClient

__all__ = ["MAX_ERROR_BODY", "MAX_PAGE_BYTES", "USER_AGENT", "Client", "Fetched"]


class Client:
    def __init__(self, max_idle: int = 64):
        self._client = _ThreadClient(max_idle=max_idle)

    async def request(self, method: str, url: str, **kwargs) -> Fetched:
        return await asyncio.to_thread(self._client.request, method, url, **kwargs)

    def close(self) -> None:
        self._client.close()
