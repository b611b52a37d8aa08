"""After a restart of a target in a ``group``: is its backend healthy again?

The group limit (``limits.py``) counts a target as restarting until its backend is seen idle or busy
again, so a watch reads it with the verdict core until it is (a ``recovered`` ledger line, which
settles the restart for the group) or ``recovery`` has passed; every watch ends at once when the
webhook stops.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .config import Config, Target
from .ledger import Ledger, LedgerError

log = logging.getLogger("hangwatch.webhook")

HEALTHY = ("idle", "busy")  # what the recovery watch must see to settle a restart


class RecoveryWatches:
    def __init__(self, config: Config, *, rechecker, ledger: Ledger, clock: Callable[[], float], replica: str):
        self.config = config
        self.rechecker = rechecker
        self.ledger = ledger
        self.clock = clock
        self.replica = replica
        self._changed = threading.Condition()
        self._unwatch = threading.Event()   # set: recovery watches end at once
        self._watches: set[threading.Thread] = set()

    def start(self, target: Target, restarted_at: float) -> None:
        thread = threading.Thread(target=self._watch, args=(target, restarted_at), daemon=True,
                                  name=f"hangwatch-recovery-{target.name}")
        with self._changed:
            if self._unwatch.is_set():
                return
            self._watches.add(thread)
        thread.start()

    def _watch(self, target: Target, restarted_at: float) -> None:
        """Read the backend with the verdict core until it is idle or busy (a ``recovered`` line)
        or ``recovery`` has passed since the restart; ends at once when the webhook stops."""
        try:
            deadline = restarted_at + self.config.recovery
            while not self._unwatch.is_set() and self.clock() < deadline:
                try:
                    state = self.rechecker(target.url, module=target.module, interval=self.config.recheck.interval,
                                           timeout=self.config.recheck.timeout, api_key=target.api_key,
                                           probe=target.probe).verdict.state
                except Exception as exc:  # a backend still loading may fail oddly: keep watching
                    state = f"error ({type(exc).__name__})"
                if state in HEALTHY and not self._unwatch.is_set():
                    now = self.clock()
                    try:
                        self.ledger.append({"event": "recovered", "at": now, "target": target.name,
                                            "restart_at": restarted_at, "verdict": state, "replica": self.replica})
                    except LedgerError as exc:  # the restart then holds the slot until recovery passes
                        log.error("ledger: cannot record that %s recovered: %s", target.name, exc)
                        return
                    log.info("recovered target=%s docker_host=%s verdict=%s after=%.0fs", target.name,
                             target.docker_host.name, state, now - restarted_at)
                    return
                self._unwatch.wait(self.config.recheck.interval)
            if not self._unwatch.is_set():
                log.warning("not recovered target=%s docker_host=%s: not idle or busy within recovery %gs "
                            "of its restart; it no longer counts as restarting for group %s",
                            target.name, target.docker_host.name, self.config.recovery, target.group)
        finally:
            with self._changed:
                self._watches.discard(threading.current_thread())
                self._changed.notify_all()

    def running(self) -> int:
        with self._changed:
            return len(self._watches)

    def wait(self, timeout: float) -> bool:
        """True once no recovery watch runs; False if ``timeout`` s pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._watches, timeout)

    def stop(self) -> None:
        self._unwatch.set()
