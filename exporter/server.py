"""``hangwatch exporter``: the server that answers ``/probe``, ``/livez``, ``/metrics``, until a signal.

The blackbox_exporter pattern: each ``/probe`` reads its one target afresh (``prober``), so no
reading is shared between scrapes or Prometheus replicas; a bad request is 400, a target
outside the allowlist 403, a failing target still 200 with ``hangwatch_up 0``. ``/probe``
sends requests wherever it is told, so it is no open relay: every query goes through
``query.asked``, a query may narrow what the config allows, never widen it, an API key goes
only to the URLs the config lists, and listening beyond loopback needs ``allow_targets`` or
``allow_any_target: true`` (exit 64 at start-up otherwise). One event loop (uvloop where it
installs; ``HANGWATCH_LOOP=asyncio|uvloop`` chooses) serves every connection and awaits every
probe and check (``httpserver.BoundedHTTPServer``), at most ``max_concurrent_probes`` at once.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Callable

from hangwatch import __version__, logs
from hangwatch.settings import EXIT_CONFIG, ConfigError, listen_address

from . import selfmetrics
from .config import ExporterConfig, load_exporter_config
from .fds import raise_fd_limit
from .httpserver import BoundedHTTPServer, new_event_loop
from .prober import Prober
from .routes import routes

log = logging.getLogger("hangwatch.exporter")


def make_server(listen: str, config: ExporterConfig) -> BoundedHTTPServer:
    prober = Prober(config)
    server = BoundedHTTPServer(listen_address(listen), routes(config, prober),
                               max_connections=config.max_connections, read_timeout=config.read_timeout,
                               workers=config.max_concurrent_probes, name="hangwatch-exporter")
    selfmetrics.watch(server)
    return server


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_exposure(listen: str, config: ExporterConfig) -> None:
    """Beyond loopback, /probe must not read any URL anyone sends it unless that is chosen."""
    host, _ = listen_address(listen)
    if not is_loopback(host) and not config.allow_targets and not config.allow_any_target:
        raise ConfigError(
            f"allow_targets: required when listening on {listen} (not loopback): /probe would read any URL "
            "anyone who reaches it sends; list the backends in allow_targets, or set allow_any_target: true")


def check_loop() -> None:
    """The loop ``HANGWATCH_LOOP`` names must exist here (uvloop may not be installed)."""
    try:
        new_event_loop().close()
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"{exc}" if isinstance(exc, ValueError) else f"HANGWATCH_LOOP=uvloop: {exc}") from None


def main(args) -> int:
    try:
        logs.setup(logs.resolve_level(getattr(args, "log_level", None)), getattr(args, "log_format", "text"))
        config = load_exporter_config(args.config)
        check_exposure(args.listen, config)
        check_loop()
        raise_fd_limit(config)
        server = make_server(args.listen, config)
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch exporter: {exc}\n")
        return EXIT_CONFIG
    except OSError as exc:
        sys.stderr.write(f"hangwatch exporter: cannot listen on {args.listen}: {exc.strerror}\n")
        return EXIT_CONFIG
    host, port = server.server_address[:2]

    def announce() -> None:
        log.info("hangwatch %s listening on http://%s:%s (allow_targets: %s; max_connections %d, "
                 "max_concurrent_probes %d)", __version__, host, port, _allowed(config), config.max_connections,
                 config.max_concurrent_probes)
    return serve_until_signalled(server, announce)


def serve_until_signalled(server: BoundedHTTPServer, announce: Callable[[], None] | None = None) -> int:
    """Serve until SIGTERM or SIGINT, then stop at once: 0 (1 if the server itself failed).

    As PID 1 in a container a process gets no default signal handling, so ``docker stop`` would
    wait and kill. ``announce`` (the "listening" line) runs only once the handlers are in place,
    so a supervisor that signals on that line meets them. The exporter holds no state: a probe
    still reading is abandoned (Prometheus records a gap, not a verdict).
    """
    # The handler only notes the signal: it runs between two bytecodes of the main thread, which
    # may hold the very lock an Event.set() would take. The wake-up fd ends the wait.
    signalled: list[int] = []
    serving = threading.Thread(target=server.serve_forever, name="hangwatch-exporter-loop", daemon=True)
    in_main = threading.current_thread() is threading.main_thread()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous_wakeup = None
    if in_main:
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: signalled.append(signum))
    serving.start()
    if announce is not None:
        announce()
    try:
        while serving.is_alive() and not signalled:
            select.select([wake_read], [], [], 1.0)
            try:
                os.read(wake_read, 64)
            except BlockingIOError:
                pass
    finally:
        if in_main:
            signal.set_wakeup_fd(previous_wakeup)
        os.close(wake_read)
        os.close(wake_write)
    failed = not serving.is_alive() and not signalled
    if signalled:
        log.info("stopping (signal)")
    server.shutdown()
    abandoned = server.abandoned  # cancelled when the loop stopped
    server.server_close()
    if failed:
        log.error("the server loop ended on its own; exiting 1")
        return 1
    log.info("exporter stopped%s", f"; abandoned {abandoned} probe(s) in progress" if abandoned else "")
    if abandoned and in_main:
        # Work cut off may have left a thread behind (a /forensics capture on BLOCKING, a name
        # being resolved), which the interpreter would join at exit: up to a deadline. Nothing
        # it holds needs closing (sockets die with us).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _allowed(config: ExporterConfig) -> str:
    if config.allow_targets:
        return f"{len(config.allow_targets)} URL(s)"
    return "any (allow_any_target)" if config.allow_any_target else "any (loopback only)"

