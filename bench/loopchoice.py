#!/usr/bin/env python3
"""``python -m hangwatch`` with the exporter's event loop chosen by ``HANGWATCH_BENCH_LOOP``.

Why: issue #23 asks whether uvloop (libuv, in C) costs less per scrape than the exporter's own
``evloop``. The exporter runs on ``evloop`` and nothing else; only the benchmark swaps the
loop, by this wrapper, so both run the same exporter code on the same fleet in the same run.

``evloop`` (the default) runs the exporter as it is. ``uvloop`` puts a ``uvloop.Loop`` where
``httpserver`` makes its loop, with the two things evloop has that asyncio's API lacks: a
``call_at`` on ``time.monotonic()`` moments (uvloop's clock is libuv's) and
``stop_threadsafe``; ``evloop.running`` becomes asyncio's running loop.

    HANGWATCH_BENCH_LOOP=uvloop python bench/loopchoice.py exporter --listen ... --config ...
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

LOOPS = ("evloop", "uvloop")


def use_uvloop() -> None:
    import uvloop

    from hangwatch.exporter import evloop, httpserver

    class UvLoop(uvloop.Loop):
        """uvloop with evloop's two extras (see the module doc)."""

        def call_at(self, when, callback, *args, context=None):
            return self.call_later(when - time.monotonic(), callback, *args)

        def stop_threadsafe(self) -> None:
            if not self.is_closed():
                self.call_soon_threadsafe(self.stop)

    httpserver.Loop = UvLoop
    evloop.running = asyncio._get_running_loop


def main() -> int:
    choice = os.environ.get("HANGWATCH_BENCH_LOOP", "evloop")
    if choice not in LOOPS:
        sys.stderr.write(f"HANGWATCH_BENCH_LOOP: {choice!r} is not one of {', '.join(LOOPS)}\n")
        return 64
    if choice == "uvloop":
        use_uvloop()
    from hangwatch.cli import main as hangwatch_main
    return hangwatch_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
