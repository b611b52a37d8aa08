#!/usr/bin/env python3
"""``python -m hangwatch`` with the exporter's event loop chosen by ``HANGWATCH_BENCH_LOOP``.

    HANGWATCH_BENCH_LOOP=uvloop python bench/loopchoice.py exporter --listen ... --config ...

How it measures: bench/README.md.
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
