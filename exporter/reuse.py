"""What the exporter keeps between scrapes — idle HTTP sessions and engine versions — and why
neither is state a reading depends on.

Every reading is still taken afresh (design.md, "Why the exporter keeps no state"); what is
kept only makes taking it cheaper:

- ``SessionPool``: idle ``requests`` sessions, at most ``IDLE_SESSIONS``. A scrape takes the
  session that last read its target, if it is still idle (its connection may still be open:
  no new TCP connection), else the least recently used one (no new session object: building
  one costs more than the read). Each session holds one connection pool of one connection,
  so re-targeting a session closes the old target's connection: open sockets and memory stay
  bounded by ``IDLE_SESSIONS``, whatever the number of backends. A session is used by one
  scrape at a time. Sessions take nothing from the environment per request (no .netrc
  credentials, no per-request proxy lookup) and keep no cookies: proxies and the CA bundle
  are read from the environment once per target, as ``requests`` would. They ask for the
  page uncompressed (``Accept-Encoding: identity``): vLLM gzips its 55 KB page at level 9
  for a client accepting gzip, about 1 ms of its API server's event loop per scrape,
  which a watchdog should not spend; the cost is ~50 KB more per scrape on the wire.
- ``VersionCache``: the engine's version (``/version``, for the info series) per target and
  process start time. A process cannot change its version without restarting, and a restart
  changes ``process_start_time_seconds``, so a cached version is never stale; a page without
  a start time (multiprocess mode) is asked every time. At most ``VERSIONS`` entries.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from functools import lru_cache
from http.cookiejar import DefaultCookiePolicy

import requests
from requests.adapters import HTTPAdapter
from requests.models import PreparedRequest, Response
from requests.sessions import merge_setting
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers, get_environ_proxies

IDLE_SESSIONS = 256
VERSIONS = 20000     # ~150 bytes each


@lru_cache(maxsize=4096)
def _proxies(target: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(get_environ_proxies(target).items()))


class LeanAdapter(HTTPAdapter):
    """requests' adapter without taking cookies from answers (the session keeps none)."""

    def build_response(self, req: PreparedRequest, resp) -> Response:  # requests: "for subclassing"
        response = Response()
        response.status_code = getattr(resp, "status", None)
        response.headers = CaseInsensitiveDict(getattr(resp, "headers", {}))
        response.encoding = get_encoding_from_headers(response.headers)
        response.raw = resp
        response.reason = resp.reason
        response.url = req.url.decode("utf-8") if isinstance(req.url, bytes) else req.url
        response.request = req
        response.connection = self
        return response


class LeanSession(requests.Session):
    """A ``requests.Session`` whose ``request()`` goes straight to its adapter for the calls
    hangwatch's fetch makes (no redirects, no auth, no cookies, no hooks, no environment):
    the same ``requests.Response`` and exceptions, a third less CPU per request (measured in
    bench/bench_exporter_scale.py). Any other call takes the full ``requests`` path."""

    _FAST = frozenset({"json", "stream", "timeout", "headers", "allow_redirects"})

    def request(self, method, url, *args, **kwargs):
        if args or kwargs.keys() - self._FAST or kwargs.get("allow_redirects", True):
            return super().request(method, url, *args, **kwargs)
        prepared = PreparedRequest()
        prepared.prepare_method(method)
        prepared.prepare_url(url, None)
        prepared.prepare_headers(merge_setting(kwargs.get("headers"), self.headers, dict_class=CaseInsensitiveDict))
        prepared.prepare_body(None, None, kwargs.get("json"))
        return self.get_adapter(prepared.url).send(prepared, stream=kwargs.get("stream", False),
                                                   timeout=kwargs.get("timeout"), verify=self.verify,
                                                   cert=self.cert, proxies=self.proxies)


CA_BUNDLE = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True


def _new_session() -> requests.Session:
    session = LeanSession()
    session.trust_env = False
    session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # keep no cookies
    # An uncompressed page: vLLM's prometheus_client gzips /metrics at level 9 for a client
    # that accepts gzip, ~1 ms of its API server's event loop per scrape for a 55 KB page.
    session.headers["Accept-Encoding"] = "identity"
    adapter = LeanAdapter(pool_connections=1, pool_maxsize=1)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class SessionPool:
    def __init__(self, capacity: int = IDLE_SESSIONS):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, tuple[str, requests.Session]] = OrderedDict()  # LRU first
        self._by_target: dict[str, list[int]] = {}

    def take(self, target: str) -> requests.Session:
        with self._lock:
            keys = self._by_target.get(target)
            if keys:
                key = keys.pop()
                if not keys:
                    del self._by_target[target]
                session = self._idle.pop(key)[1]
            elif self._idle:
                key, (old, session) = self._idle.popitem(last=False)
                self._forget(old, key)
            else:
                session = None
        if session is None:
            session = _new_session()
        session.proxies = dict(_proxies(target))
        session.verify = CA_BUNDLE if target.startswith("https:") else True  # (a path costs a stat per request)
        return session

    def give_back(self, target: str, session: requests.Session) -> None:
        evicted = None
        with self._lock:
            key = id(session)
            self._idle[key] = (target, session)
            self._by_target.setdefault(target, []).append(key)
            if len(self._idle) > self.capacity:
                old_key, (old, evicted) = self._idle.popitem(last=False)
                self._forget(old, old_key)
        if evicted is not None:
            evicted.close()

    def _forget(self, target: str, key: int) -> None:
        keys = self._by_target.get(target)
        if keys and key in keys:
            keys.remove(key)
            if not keys:
                del self._by_target[target]

    def __len__(self) -> int:
        return len(self._idle)


class VersionCache:
    def __init__(self, capacity: int = VERSIONS):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._versions: OrderedDict[tuple[str, str, float], str] = OrderedDict()

    def get(self, target: str, engine: str, process_start: float | None) -> str | None:
        if process_start is None:
            return None
        with self._lock:
            return self._versions.get((target, engine, process_start))

    def put(self, target: str, engine: str, process_start: float | None, version: str | None) -> None:
        if process_start is None or version is None:
            return  # no identity to key on, or nothing learned: ask again next scrape
        with self._lock:
            self._versions[(target, engine, process_start)] = version
            self._versions.move_to_end((target, engine, process_start))
            while len(self._versions) > self.capacity:
                self._versions.popitem(last=False)
