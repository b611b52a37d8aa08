"""The request's container lookups, one Docker host at a time slot, never one host for another.

``POST /alerts`` answers within a second, so each alert's container is looked up under a
deadline before its job is queued: a Docker host that cannot say whether the container exists is
a 503, and Alertmanager retries. With many hosts, one that hangs must cost only its own
targets. So each host has its own small pool (``SLOTS`` threads): the hosts of one request
are asked side by side, a hung host's calls pile up (and are cancelled) in its own queue
only, and another host's lookup never waits behind them. A lookup that outlives its request
finishes in its host's thread, bounded by the Docker client's own timeout.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Callable, Iterable

from .config import Target
from .restarter import ContainerNotFound, DockerError

SLOTS = 2  # threads per Docker host for lookups in requests


class HostLookups:
    def __init__(self, hosts: Iterable[str], find: Callable[[Target], object]):
        self._find = find
        self._pools = {name: concurrent.futures.ThreadPoolExecutor(max_workers=SLOTS,
                                                                   thread_name_prefix=f"hangwatch-docker-{name}")
                       for name in hosts}

    def find_all(self, targets: Iterable[Target], timeout: float) -> dict[str, bool | str]:
        """Per target name: True (its container exists), False (it does not), or why its
        host could not say (unreachable, a Docker error, no answer within ``timeout`` s)."""
        give_up = time.monotonic() + timeout
        by_host: dict[str, list[Target]] = {}
        for target in targets:
            by_host.setdefault(target.docker_host.name, []).append(target)
        futures = {host: self._pools[host].submit(self._lookup_host, members) for host, members in by_host.items()}
        concurrent.futures.wait(futures.values(), timeout=max(0.0, give_up - time.monotonic()))
        found: dict[str, bool | str] = {}
        for host, future in futures.items():
            if future.done() and not future.cancelled():
                try:
                    found.update(future.result())
                    continue
                except DockerError as exc:
                    why = str(exc) or type(exc).__name__
            else:
                future.cancel()  # not started: never runs; running: finishes in its host's thread
                why = f"docker host {host}: no answer within {timeout:g}s"
            found.update({target.name: why for target in by_host[host]})
        return found

    def _lookup_host(self, targets: list[Target]) -> dict[str, bool]:
        found = {}
        for target in targets:
            try:
                self._find(target)
                found[target.name] = True
            except ContainerNotFound:
                found[target.name] = False
        return found

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
