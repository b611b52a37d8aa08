"""A small event loop for the exporter's server: file descriptors, timers, calls from threads.

Not asyncio: a busy backend's scrape is two cold wake-ups, and asyncio spends dozens of Python
calls of its own on each; here a ready descriptor is one dict look-up and one call
(bench/RESULTS-exporter.md). It offers the part of asyncio's loop API the exporter uses, so
``loopfetch`` runs on either. A callback that raises is logged and the loop goes on.
"""
from __future__ import annotations

import collections
import heapq
import logging
import os
import select
import threading
import time
from itertools import count

log = logging.getLogger("hangwatch.exporter.evloop")

_READ = select.EPOLLIN
_WRITE = select.EPOLLOUT
# An error or hang-up on a descriptor wakes whoever watches it: the callback's own recv or
# send then says what happened (as asyncio's selector does).
_ERRORS = select.EPOLLERR | select.EPOLLHUP

_local = threading.local()


def running() -> "Loop | None":
    """The loop running in this thread (None outside one), as ``asyncio.get_running_loop``."""
    return getattr(_local, "loop", None)


class Timer:
    """A call at a moment (``time.monotonic``); ``cancel()`` before it fires and it never does."""

    __slots__ = ("when", "callback", "args", "cancelled", "_loop")

    def __init__(self, when: float, callback, args: tuple, loop: "Loop | None" = None):
        self.when, self.callback, self.args, self.cancelled, self._loop = when, callback, args, False, loop

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self.callback = self.args = None  # nothing a cancelled timer held is kept alive
        if self._loop is not None:
            self._loop._cancelled += 1  # still in the heap: counted, so the heap is compacted in time


class _Soon:
    """What ``call_soon`` returns: cancellable like a Timer."""

    __slots__ = ("callback", "args", "cancelled")

    def __init__(self, callback, args: tuple):
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """One epoll, a heap of timers, a queue of calls. Everything but ``call_soon_threadsafe`` and
    ``stop_threadsafe`` is for the loop's own thread."""

    def __init__(self):
        self._epoll = select.epoll()
        self._readers: dict[int, tuple] = {}   # fd -> (callback, args)
        self._writers: dict[int, tuple] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = count()
        self._cancelled = 0
        self._soon: collections.deque = collections.deque()
        self._from_threads: collections.deque = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._epoll.register(self._wake_read, _READ)
        self._stopping = False
        self._closed = False
        self._thread: int | None = None

    # -- descriptors ------------------------------------------------------------------------------
    def time(self) -> float:
        return time.monotonic()

    def add_reader(self, fd: int, callback, *args) -> None:
        self._watch(fd, self._readers, (callback, args))

    def add_writer(self, fd: int, callback, *args) -> None:
        self._watch(fd, self._writers, (callback, args))

    def remove_reader(self, fd: int) -> bool:
        return self._unwatch(fd, self._readers)

    def remove_writer(self, fd: int) -> bool:
        return self._unwatch(fd, self._writers)

    def _mask(self, fd: int) -> int:
        return (_READ if fd in self._readers else 0) | (_WRITE if fd in self._writers else 0)

    def _watch(self, fd: int, table: dict, entry: tuple) -> None:
        before = self._mask(fd)
        table[fd] = entry
        after = self._mask(fd)
        if before == after:
            return
        try:
            if before:
                self._epoll.modify(fd, after)
            else:
                self._epoll.register(fd, after)
        except BaseException:
            del table[fd]
            raise

    def _unwatch(self, fd: int, table: dict) -> bool:
        if table.pop(fd, None) is None:
            return False
        after = self._mask(fd)
        try:
            if after:
                self._epoll.modify(fd, after)
            else:
                self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass  # already closed: the kernel dropped it from the epoll set with the last close
        return True

    # -- calls --------------------------------------------------------------------------------------
    def call_at(self, when: float, callback, *args) -> Timer:
        timer = Timer(when, callback, args, self)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    def call_later(self, delay: float, callback, *args) -> Timer:
        return self.call_at(time.monotonic() + delay, callback, *args)

    def call_soon(self, callback, *args) -> _Soon:
        handle = _Soon(callback, args)
        self._soon.append(handle)
        return handle

    def call_soon_threadsafe(self, callback, *args) -> None:
        """From any thread. RuntimeError once the loop is closed (as asyncio's)."""
        if self._closed:
            raise RuntimeError("the loop is closed")
        self._from_threads.append((callback, args))
        self._wake()

    def stop_threadsafe(self) -> None:
        """Stop ``run_forever`` from any thread (a no-op once closed)."""
        self._stopping = True
        if not self._closed:
            self._wake()

    def stop(self) -> None:
        self._stopping = True

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending anyway
        except OSError:
            pass  # closed meanwhile

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._readers.clear()
        self._writers.clear()
        self._timers.clear()
        self._cancelled = 0
        self._soon.clear()
        self._from_threads.clear()
        self._epoll.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    # -- running ------------------------------------------------------------------------------------
    def run_forever(self) -> None:
        if self._closed:
            raise RuntimeError("the loop is closed")
        self._stopping = False
        self._thread = threading.get_ident()
        _local.loop = self
        poll, readers, writers, wake = self._epoll.poll, self._readers, self._writers, self._wake_read
        try:
            while not self._stopping:
                timeout = self._timeout()
                for fd, events in poll(timeout):
                    if fd == wake:
                        self._drain_wake()
                        continue
                    if events & (_READ | _ERRORS):
                        entry = readers.get(fd)
                        if entry is not None:
                            self._run(entry[0], entry[1])
                    if events & (_WRITE | _ERRORS):
                        entry = writers.get(fd)
                        if entry is not None:
                            self._run(entry[0], entry[1])
                self._run_due()
        finally:
            _local.loop = None
            self._thread = None

    def _timeout(self) -> float:
        if self._soon or self._from_threads:
            return 0
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
            self._cancelled -= 1
        if not timers:
            return -1
        return max(0.0, timers[0][0] - time.monotonic())

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _run_due(self) -> None:
        """Calls from threads, calls made soon, then every timer that is due."""
        from_threads = self._from_threads
        while from_threads:
            callback, args = from_threads.popleft()
            self._run(callback, args)
        soon = self._soon
        for _ in range(len(soon)):  # those queued by these calls run on the next round
            handle = soon.popleft()
            if not handle.cancelled:
                self._run(handle.callback, handle.args)
        timers = self._timers
        if not timers:
            return
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                self._cancelled -= 1
                continue
            callback, args = timer.callback, timer.args
            timer._loop = None  # fired: no longer in the heap, a late cancel() counts nothing
            timer.cancel()
            self._run(callback, args)
        if self._cancelled > 256 and self._cancelled > len(timers) // 2:
            # Every request re-arms its connection's timer: without this, cancelled timers
            # would pile up for as long as their original moments (minutes of idle timeouts).
            self._timers = timers = [entry for entry in timers if not entry[2].cancelled]
            heapq.heapify(timers)
            self._cancelled = 0

    @staticmethod
    def _run(callback, args) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("exception in a loop callback %r", callback)
