"""The one TLS context and the short forms a reading's failure messages use. Building an
``SSLContext`` reads the system's CA store, too much work to repeat per connection, so every
connection (``hangwatch.client``) shares one. (Name resolution and each address's connect are the
client's, on the event loop: ``loop.getaddrinfo`` and non-blocking connects within one deadline.)
"""
from __future__ import annotations

import functools
import ssl


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The one TLS configuration readings use (the system's CA store, host names checked),
    built once and shared: an ``SSLContext`` is safe to use from every thread."""
    return ssl.create_default_context()


def shown_host(host: str) -> str:
    return repr(host if len(host) <= 80 else host[:77] + "...")


def short_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
