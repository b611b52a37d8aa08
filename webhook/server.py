"""Serving the webhook: waitress with limits, and a stop that never cuts a restart in half.

A client may be slow on purpose, so a connection must cost a file descriptor, never a thread: waitress
hands only complete requests to its workers, bounds idle and open connections, and ``BodyGate`` refuses
to read a body without a token the app accepts (docs/design.md, "Why the webhook is served by
waitress"). On SIGTERM it stops accepting, lets requests in progress answer, then
``WebhookState.shutdown``: no new restart begins, one under way finishes within its bound, jobs still
re-checking are abandoned (Alertmanager re-sends).
"""
from __future__ import annotations

import logging
import signal
import sys
import time
from typing import Callable

from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser

log = logging.getLogger("hangwatch.webhook")

THREADS = 8              # request threads; a request does triage and one Docker lookup (< 1 s)
CONNECTION_LIMIT = 256   # open connections; Alertmanager needs a handful (more wait in the backlog)
CHANNEL_TIMEOUT = 10     # seconds a connection may sit idle (Alertmanager sends a request in ms)
CLEANUP_INTERVAL = 2     # seconds between sweeps for idle connections
MAX_HEADER_BYTES = 8 * 1024      # request line and headers; Alertmanager sends about 300 bytes
MAX_BODY_BYTES = 2 * 1024 * 1024  # 1.7 x Alertmanager's notification of 1,000 hang alerts (1.18 MiB)
POLL = 0.5               # seconds; a stop asked for by a signal is seen within this
DRAIN = 5.0              # seconds requests in progress get to answer after a stop


class BodyGate(HTTPRequestParser):
    """Waitress's request parser, asking ``may_send_body(authorization)`` once the head is in:
    no, and the body is never read (the request goes on without it; the connection closes)."""

    may_send_body: Callable[[str], bool] = staticmethod(lambda authorization: True)

    def received(self, data: bytes) -> int:
        in_head = not self.headers_finished
        consumed = super().received(data)
        if in_head and self.headers_finished and not self.completed and self.body_rcv is not None \
                and not self.may_send_body(self.headers.get("AUTHORIZATION", "")):
            self.body_rcv.getbuf().close()
            self.body_rcv, self.chunked, self.content_length = None, False, 0
            self.headers["CONTENT_LENGTH"] = "0"
            self.headers["CONNECTION"] = "close"  # what follows on this connection is the body
            self.expect_continue = False          # never invite it
            self.completed = True
            return len(data)                      # the rest of this read is body: dropped
        return consumed


def gated_channel(may_send_body: Callable[[str], bool]) -> type[HTTPChannel]:
    parser = type("WebhookBodyGate", (BodyGate,), {"may_send_body": staticmethod(may_send_body)})
    return type("WebhookChannel", (HTTPChannel,), {"parser_class": parser})


class Server:
    """One waitress server on ``host:port`` (port 0: any free port, see ``port``)."""

    def __init__(self, app, host: str, port: int, *, threads: int = THREADS,
                 connection_limit: int = CONNECTION_LIMIT, channel_timeout: int = CHANNEL_TIMEOUT,
                 cleanup_interval: int = CLEANUP_INTERVAL, may_send_body: Callable[[str], bool] | None = None):
        from waitress.server import create_server
        self._server = create_server(
            app, host=host, port=port, threads=threads, connection_limit=connection_limit,
            channel_timeout=channel_timeout, cleanup_interval=cleanup_interval, asyncore_use_poll=True,
            max_request_header_size=MAX_HEADER_BYTES, max_request_body_size=MAX_BODY_BYTES,
            inbuf_overflow=MAX_BODY_BYTES, ident="hangwatch", clear_untrusted_proxy_headers=True,
            expose_tracebacks=False)
        if may_send_body is not None:
            self._server.channel_class = gated_channel(may_send_body)
        self.host = host
        self._stop = False

    @property
    def port(self) -> int:
        return int(self._server.effective_port)  # waitress gives it as text

    def request_stop(self, wake: bool = True) -> None:
        """Stop serving soon. From a signal handler pass ``wake=False`` (only a flag is set)."""
        already, self._stop = self._stop, True
        if wake and not already:
            try:
                self._server.pull_trigger()
            except OSError:  # already closed: nothing left to wake
                pass

    def serve_until_stopped(self) -> None:
        loop, sockets = self._server.asyncore.loop, self._server._map
        try:
            while not self._stop:
                loop(timeout=POLL, map=sockets, use_poll=True, count=1)
        finally:
            self._drain(loop, sockets)

    def _drain(self, loop, sockets) -> None:
        """Close the listening socket, give requests in progress ``DRAIN`` s, close the rest."""
        server = self._server
        server.accepting = False
        server.asyncore.dispatcher.close(server)  # the listener only; the trigger still wakes the loop
        deadline = time.monotonic() + DRAIN
        while time.monotonic() < deadline and self._busy():
            loop(timeout=0.05, map=sockets, use_poll=True, count=1)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=1)
        server.asyncore.close_all(sockets)

    def _busy(self) -> bool:
        channels = list(getattr(self._server, "active_channels", {}).values())
        return any(getattr(c, "requests", None) or getattr(c, "total_outbufs_len", 0) for c in channels)


def serve(app, host: str, port: int, *, banner: str = "", install_signals: bool = True,
          ready: Callable[[Server], None] | None = None, **limits) -> int:
    """Serve the webhook ``app`` until SIGTERM/SIGINT (or ``request_stop()``), then stop it
    cleanly; the exit code. ``ready`` receives the running ``Server`` (its port, a stop handle)."""
    state = app.extensions["hangwatch"]
    try:
        server = Server(app, host, port, may_send_body=state.may_send_body, **limits)
    except OSError as exc:
        sys.stderr.write(f"hangwatch webhook: cannot listen on {host}:{port}: {exc.strerror or exc}\n")
        state.close()
        return 1
    if install_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: server.request_stop(wake=False))
    if ready is not None:
        ready(server)  # first: whoever acts on the "listening" line may signal at once (its handlers)
    log.info("webhook listening on http://%s:%s%s", host, server.port, f" ({banner})" if banner else "")
    server.serve_until_stopped()
    bound = state.restart_bound
    log.info("stopping: no new restart begins; a restart under way gets up to %.0fs", bound)
    if not state.shutdown(bound):
        log.warning("stopping with a restart still under way after %.0fs", bound)
    log.info("webhook stopped")
    return 0
