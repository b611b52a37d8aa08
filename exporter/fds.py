"""How many file descriptors the exporter may need, and the idle-connection pool that fits in them.

Idle keep-alive connections to the backends are kept (LRU) because the same backends are read
every scrape interval. The pool is large: one too small for the scrape rate closes connections
before the backend's own keep-alive does, which leaves sockets in TIME_WAIT and makes connect()
costly (bench/RESULTS-exporter.md). A kept idle connection must never cost a probe its socket,
so the pool shrinks to what the limit leaves. Every probe, check and version ask is awaited on
the server's one loop, through one ``hangwatch.client.Client`` (``prober``); /livez and /readyz
have a small pool of their own (``HEALTH_IDLE_CONNECTIONS``).
"""
from __future__ import annotations

import logging
import resource

from .config import ExporterConfig

IDLE_CONNECTIONS = 2048         # the probes' pool: 400 scrapes a second against a 5 s keep-alive
HEALTH_IDLE_CONNECTIONS = 64    # the /livez and /readyz checks' pool

log = logging.getLogger("hangwatch.exporter")


def fds_besides_the_pool(config: ExporterConfig) -> int:
    # Every allowed client connection; per probe up to three sockets (the reading, a probe, a
    # version); the checks' pool; files, pipes and the listening socket.
    return config.max_connections + HEALTH_IDLE_CONNECTIONS + 3 * config.max_concurrent_probes + 64


def pool_size(config: ExporterConfig) -> int:
    """``IDLE_CONNECTIONS``, or what the file-descriptor limit leaves beside everything else."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return IDLE_CONNECTIONS
    return max(0, min(IDLE_CONNECTIONS, soft - fds_besides_the_pool(config)))


def raise_fd_limit(config: ExporterConfig) -> None:
    """Room for every allowed connection, idle backend connection and probe (the soft limit is often 1024)."""
    needed = fds_besides_the_pool(config) + IDLE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < needed:
            log.warning("only %d file descriptors (hard limit); max_connections %d needs about %d",
                        new, config.max_connections, needed)
