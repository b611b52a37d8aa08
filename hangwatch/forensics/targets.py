"""One spelling per forensics target: the key the allowlist and the capture guard both use.

``127.2``, ``2130706434``, ``0x7f000002`` and ``127.0.0.2`` are one address to the kernel, so a
guard keyed by the text would see four targets (four captures at once) and an allowlist compared
by text could be walked around. Every target is canonicalised here before it is matched or
guarded: the scheme and host lower-cased, an IPv4 address in any inet_aton spelling made dotted
quad, IPv6 compressed, the default port written out, no trailing slash. An IPv6 zone id
(``[::1%25lo]``) names an interface, not a server: refused with a reason.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class TargetError(ValueError):
    """The URL cannot be a forensics target; the message says why without repeating it."""


def canonical_url(url: str) -> str:
    """``scheme://host:port[/path]`` in its one spelling (``TargetError`` when it cannot be one)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except (ValueError, AttributeError):
        raise TargetError("is not a URL") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise TargetError("must be http(s)://HOST[:PORT]")
    if "%" in parts.netloc:
        raise TargetError("carries an IPv6 zone id (%...): name the server by an address without one")
    if "@" in parts.netloc:
        raise TargetError("must not carry credentials (user:password@)")
    host = canonical_host(parts.hostname)
    shown = f"[{host}]" if ":" in host else host
    path = parts.path.rstrip("/")
    return f"{scheme}://{shown}:{port or DEFAULT_PORTS[scheme]}{path}"


def canonical_host(host: str) -> str:
    """An address in its one spelling; a name lower-cased (``inet_aton`` reads ``127.2`` and ``0x7f000002``)."""
    host = host.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefx." for c in host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            pass
    return host
