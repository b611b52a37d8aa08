"""The one way tests and the demo wait: poll a condition until one wall-clock deadline.

Never a bare ``sleep`` hoping the other side is done: every wait names what it waits for,
holds one deadline whatever the other side does, and says at the deadline what it saw last.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """A condition did not hold by its deadline. An AssertionError, so pytest reports a failed
    test (not a crashed one); a TimeoutError, so callers that catch timeouts keep working."""


def wait_until(predicate: Callable[[], T], deadline: float, what: str, *, interval: float = 0.1,
               ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that value; raise :class:`WaitTimeout` naming ``what`` after ``deadline`` seconds.

    Exceptions listed in ``ignore`` (say, a connection refused while a server starts) count as
    "not yet"; the last one is reported at the deadline. Anything else propagates at once, so a
    predicate can fail fast (``process.check_alive()``). The predicate is called once more at
    the deadline: a slow last call cannot turn a condition that holds into a timeout.
    """
    end = time.monotonic() + deadline
    last_error: BaseException | None = None
    while True:
        final = time.monotonic() >= end
        try:
            value = predicate()
        except ignore as exc:
            value, last_error = None, exc
        if value:
            return value
        if final:
            detail = f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
            raise WaitTimeout(f"timed out after {deadline:g}s waiting for {what}{detail}")
        time.sleep(max(0.0, min(interval, end - time.monotonic())))


def wait_for_seconds(seconds: float, what: str, *, check: Callable[[], object] | None = None,
                     interval: float = 0.1) -> None:
    """Let ``seconds`` of wall-clock time pass (an observation window, not a guess that the
    other side is done), calling ``check`` every ``interval`` so a dead part fails at once."""
    end = time.monotonic() + seconds

    def elapsed():
        if check is not None:
            check()
        return time.monotonic() >= end
    wait_until(elapsed, seconds + max(5.0, seconds), what, interval=interval)
