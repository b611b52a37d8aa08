"""Ports on 127.0.0.1 without races, for the servers that cannot bind port 0 themselves.

A port picked by binding port 0, closing it and handing the number to a child process is
free only until someone else takes it: under load a client connection's ephemeral port did
(a FastChat worker died "address already in use" in CI). So:

- a server that can bind port 0 is started on port 0, and
  ``hangwatch.demo.processes.listening_ports`` reads the port it bound from /proc (Prometheus,
  Alertmanager, the exporter, the webhook, the simulator, FastChat's controller and API server);
- a server that must be told its port before it binds (a FastChat worker announces its own
  address; vLLM) gets a :func:`free_port` and is restarted on another one when its log says
  the bind failed (:func:`address_in_use`);
- a test that needs a refused connection gets a :func:`closed_port`.
"""
from __future__ import annotations

import re
import socket

_IN_USE = re.compile(r"address already in use|EADDRINUSE|errno 98|couldn't bind|bind: address",
                     re.IGNORECASE)


def free_port() -> int:
    """A loopback port free at this instant. Racy by nature: only for servers that must know
    their port before binding it, started with a retry on :func:`address_in_use`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Sockets bound by closed_port(), held open (never listening) until the test process ends.
_HELD: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port nothing listens on and nothing else can take: connection refused.

    The port stays bound — but never listening — by a socket this process holds until it
    exits. A connect() to a bound, non-listening TCP port is refused (RST), and no other
    process (another xdist worker, a client's ephemeral port) can bind it meanwhile: a port
    freed by closing it could be taken before the "refused" test connects."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    return sock.getsockname()[1]


def address_in_use(log_text: str) -> bool:
    """Did a server's output say its port was taken?"""
    return bool(_IN_USE.search(log_text))
