"""Parsed ``/probe`` queries, kept: Prometheus sends each target the same query every scrape.

The answer depends on the query and the fixed config alone, so a good one is read once
(``query.asked``). Bounded so that a client cannot fill memory: at most ``QUERIES`` good
queries of at most ``MAX_KEPT_QUERY`` characters; a refused one is never kept.
"""
from __future__ import annotations

import threading

from . import query as queries
from .config import ExporterConfig
from .query import Asked, Refused

QUERIES = 20000  # one per target and module; ~300 bytes each
MAX_KEPT_QUERY = 512


class QueryCache:
    def __init__(self, config: ExporterConfig):
        self.config = config
        self.kept: dict[str, Asked] = {}
        self._lock = threading.Lock()  # the loop and the workers both ask

    def asked(self, query: str) -> Asked | Refused:
        known = self.kept.get(query)
        if known is not None:
            return known
        read = queries.asked(query, self.config)
        if isinstance(read, Refused) or len(query) > MAX_KEPT_QUERY:
            return read
        with self._lock:
            while len(self.kept) >= QUERIES:
                self.kept.pop(next(iter(self.kept)))  # the oldest (dicts keep insertion order)
            self.kept[query] = read
        return read
