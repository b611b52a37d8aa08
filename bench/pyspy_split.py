#!/usr/bin/env python3
"""Where an exporter's CPU goes, from a py-spy ``--format raw`` profile (``--native`` best).

    py-spy record --rate 500 --native --format raw -d 15 -p PID -o run.raw
    python bench/pyspy_split.py run.raw [--top 25]

Samples whose innermost frame is the loop or the main thread waiting (``epoll_pwait``,
``select``, ``poll``) are idle and dropped; every other sample is counted twice: by *room* (the
innermost hangwatch or exporter file on its stack, grouped by who owns it: the client's
transport, the server's transport, the reading, the render, the rest) and by *kind* of its
innermost frame (a system call in libc, the regular-expression engine, uvloop's C, Python code
of the project, other C). That is the split bench/RESULTS-busy-spread.md writes down.
"""
from __future__ import annotations

import argparse
import collections
import re

IDLE = ("epoll_pwait", "epoll_wait", "select", "pselect", "poll",
        "BoundedHTTPServer.serve_forever", "serve_until_signalled")  # the last two: a profile without --native
ROOMS = {
    "client transport": ("hangwatch/client.py", "hangwatch/answer.py", "hangwatch/streamwire.py",
                         "hangwatch/connect.py", "hangwatch/idlepool.py"),
    "server transport": ("exporter/httpserver.py", "exporter/httpprotocol.py", "exporter/httpwire.py",
                         "exporter/admission.py"),
    "reading (parse)": ("hangwatch/reading.py", "hangwatch/engines.py"),
    "series + render": ("exporter/collector.py", "hangwatch/exposition.py"),
}
PROJECT = re.compile(r"\(((?:hangwatch|exporter)/[^:]+)")


def room_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        found = PROJECT.search(frame)
        if found:
            path = found.group(1)
            for room, paths in ROOMS.items():
                if path in paths:
                    return room
            return "probe logic (" + path + ")"
    return "outside the project"


def kind_of(leaf: str) -> str:
    if "(libc.so" in leaf:
        return "system call (libc)"
    if leaf.startswith(("sre_", "_sre_")):
        return "regular expressions (C)"
    if "loop.c" in leaf or "uvloop" in leaf or "libuv" in leaf or leaf.startswith("uv_"):
        return "uvloop / libuv (C)"
    if PROJECT.search(leaf) or ".py:" in leaf:
        return "Python"
    return "other C (CPython, httptools)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=25, help="functions listed (self time)")
    args = parser.parse_args(argv)
    rooms, kinds, leaves = collections.Counter(), collections.Counter(), collections.Counter()
    idle = work = 0
    with open(args.raw) as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames, n = stack.split(";"), int(count)
            if frames[-1].split(" ")[0] in IDLE:
                idle += n
                continue
            work += n
            rooms[room_of(frames)] += n
            kinds[kind_of(frames[-1])] += n
            leaves[frames[-1]] += n
    print(f"{work} working samples ({idle} idle dropped)")
    for title, table in (("room (innermost project file)", rooms), ("kind (innermost frame)", kinds)):
        print(f"\nby {title}:")
        for name, n in table.most_common():
            print(f"  {100 * n / work:5.1f}%  {name}")
    print(f"\ntop {args.top} functions (self):")
    for name, n in leaves.most_common(args.top):
        print(f"  {100 * n / work:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
