#!/usr/bin/env python3
"""The hangwatch image's HEALTHCHECK: asks the hangwatch server in this container about itself.

Docker runs it inside the container (``HEALTHCHECK`` in the Dockerfile). One image runs every
hangwatch command, so it first reads PID 1's command line to learn which server runs and on
which address (``hangwatch exporter --listen 0.0.0.0:9877``, or ``docker-init -- hangwatch ...``
under ``init: true``), then asks that server, never a model server:

- ``exporter``: ``GET /metrics``. The exporter answers it on its event loop without a probe
  worker, so it proves the loop turns even while every worker waits on a stalled backend, and
  it reads no backend. Pointing ``hangwatch check`` (or ``/probe``) at vLLM here would add a
  request to the server hangwatch protects every interval, and would call the *exporter*
  unhealthy whenever a *backend* is; judging backends is Prometheus' job, through the rules.
- ``webhook``: ``GET /healthz`` (answered by the webhook itself; Docker is not asked).
- anything else (``check``, ``simulate``, ``rules``, ``--help``): healthy, nothing to ask.

Exit 0 healthy, 1 unhealthy (Docker's convention), within ``TIMEOUT`` seconds whatever the
server does. Standard library only.

    python3 deploy/healthcheck.py [--pid PID]     # PID whose command line to read (default 1)
"""
from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request

TIMEOUT = 3.0  # seconds; the Dockerfile gives the whole check 5
SERVERS = {"exporter": ("127.0.0.1:9877", "/metrics"), "webhook": ("127.0.0.1:9878", "/healthz")}


def command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]


def hangwatch_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``hangwatch`` (a console script path, or ``-m hangwatch``), or None."""
    for index, part in enumerate(argv):
        if os.path.basename(part) == "hangwatch":
            return argv[index + 1:]
    return None


def health_url(argv: list[str]) -> str | None:
    """The URL to ask for ``argv`` (a hangwatch server's command line), or None if none runs."""
    args = hangwatch_args(argv)
    if not args or args[0] not in SERVERS:
        return None
    listen, path = SERVERS[args[0]]
    for index, part in enumerate(args):
        if part == "--listen" and index + 1 < len(args):
            listen = args[index + 1]
        elif part.startswith("--listen="):
            listen = part.split("=", 1)[1]
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


def healthy(url: str, timeout: float = TIMEOUT) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200, f"{url}: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {getattr(exc, 'reason', None) or exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, default=1, help="the process whose command line names the server")
    args = parser.parse_args(argv)
    try:
        url = health_url(command_line(args.pid))
    except OSError as exc:
        print(f"unhealthy: cannot read the command line of pid {args.pid}: {exc.strerror}")
        return 1
    if url is None:
        print("healthy: no hangwatch server runs here")
        return 0
    ok, detail = healthy(url)
    print(("healthy: " if ok else "unhealthy: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
