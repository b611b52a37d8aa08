"""The small toolkit every hangwatch config and flag is validated with, in one place.

A restarter that acts on a typo is worse than none, so each face (exporter, webhook) turns
its YAML into frozen dataclasses with these helpers before it binds a port: every key is
known, every value typed and ranged, and every error names its path
(``targets[1].contanier: unknown key``). Durations always carry a unit (``15`` what?),
URLs never carry credentials, and a listen address is ``HOST:PORT``, the same way everywhere.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping
from urllib.parse import urlsplit

import yaml

EXIT_CONFIG = 64  # every command exits with this on bad usage or a bad config (DESIGN.md)


class ConfigError(ValueError):
    """One bad key or flag; the message starts with its path (``targets[2].url: required``)."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: Any, path: str, *, low: float = 0.0, high: float = 30 * 86400.0) -> float:
    """Seconds from ``500ms``, ``10s``, ``1.5m`` or ``2h``; a bare number is refused (15 what?)."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ConfigError(f"{path}: expected a duration like 10s, 15m or 1h, got {show(value)}")
    match = _DURATION.match(value)
    if not match:
        raise ConfigError(f"{path}: {value!r} is not a duration (use e.g. 500ms, 10s, 15m, 1h)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not low <= seconds <= high:
        raise ConfigError(f"{path}: {value} is out of range ({human(low)} to {human(high)})")
    return seconds


def optional_duration(data: Mapping, key: str, parent: str, default: float, low: float, high: float) -> float:
    """``data[key]`` as a ranged duration, or ``default`` when the key is absent."""
    if key not in data:
        return default
    return duration(data[key], f"{parent}.{key}" if parent else key, low=low, high=high)


def human(seconds: float) -> str:
    """``3600`` → ``1h``, ``90`` → ``90s``: durations in messages as users write them."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def mapping(raw: Any, path: str, allowed: set[str] | frozenset[str],
            required: set[str] | frozenset[str] = frozenset()) -> Mapping:
    """``raw`` as a mapping with only ``allowed`` keys and every ``required`` one (``path`` "" = top)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {show(raw)}")
    prefix = f"{path}." if path else ""
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{prefix}{key}: unknown key (known: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in raw:
            raise ConfigError(f"{prefix}{key}: required")
    return raw


def string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: expected a non-empty string, got {show(value)}")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {show(value)}")
    return value


def string_list(value: Any, path: str, *, non_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or (non_empty and not value):
        raise ConfigError(f"{path}: expected a {'non-empty ' if non_empty else ''}list")
    return tuple(string(item, f"{path}[{i}]") for i, item in enumerate(value))


def split_url(text: str, path: str):
    """``urlsplit`` whose port is valid (reading ``.port`` afterwards cannot raise), or a
    ConfigError naming ``path``."""
    try:
        parts = urlsplit(text)
        parts.port
    except ValueError:
        raise ConfigError(f"{path}: {show(text)} is not a URL") from None
    return parts


def http_url(value: Any, path: str, *, allow_path: bool = False) -> str:
    """``scheme://host[:port]`` (a base path only when ``allow_path``); never credentials,
    a query or a fragment: a URL is where hangwatch sends requests, so it says nothing else.
    The error shows the value with any ``user:password@`` cut out: never a secret in a message."""
    problem = url_problem(value, allow_path=allow_path)
    if problem:
        raise ConfigError(f"{path}: {show(without_credentials(value))} {problem}")
    return value.rstrip("/")


def url_problem(value: Any, *, allow_path: bool = False) -> str | None:
    """What is wrong with ``value`` as an ``http_url`` (None: nothing), without repeating it:
    an answer to an untrusted query can say why without echoing what was sent."""
    if not isinstance(value, str) or not value.strip():
        return "is not an http(s) URL"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be http(s)://HOST[:PORT]"
    if "@" in parts.netloc:
        return "must not carry credentials (user:password@)"
    if "%" in parts.netloc:
        return "carries an IPv6 zone id (%...): name the server by an address without one"
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "must not carry a query or a fragment"
    if "v1" in parts.path.split("/"):  # the OpenAI base URL, the most common paste
        return "is an OpenAI API URL: use the server's base URL, without /v1 (hangwatch finds /metrics and /v1 itself)"
    if parts.path.strip("/") and not allow_path:
        return "must be http(s)://HOST[:PORT] without a path"
    if port == 0:
        return "has port 0, which is not a port"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "contains spaces or control characters"
    return None


def without_credentials(value: Any) -> Any:
    """``value`` with everything up to the last ``@`` of what may be its authority replaced by
    ``***@``: a message may show where a URL points, never whose password it carries."""
    if not isinstance(value, str) or "@" not in value:
        return value
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    authority_end = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i != -1] or [len(rest)])
    authority = rest[:authority_end]
    if "@" not in authority:
        # No authority-shaped "@" (``user:pw@host`` without a scheme parses as a path): cut up to the last one.
        return "***@" + value.rpartition("@")[2]
    return f"{scheme}{sep}***@{authority.rpartition('@')[2]}{rest[authority_end:]}"


LOOPBACK = "127.0.0.1"


def listen_address(text: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9877`` for IPv6) or ``:PORT`` (loopback, as every default here:
    all interfaces are ``0.0.0.0:PORT``, said out loud) → (host, port); port 0 = any free port."""
    raw, sep, port = text.rpartition(":")
    host = raw.strip("[]") if raw else LOOPBACK
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{flag}: {text!r} is not HOST:PORT or :PORT (e.g. 127.0.0.1:9877, :9877, 0.0.0.0:9877)")
    return host, int(port)


def load_yaml(path: str) -> Any:
    """The parsed YAML file; a ConfigError naming the file when it cannot be read, is not UTF-8
    (the byte's offset, line and column) or is not YAML (the parser's own words for what is wrong)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8: {not_utf8(data, exc)}; save it as UTF-8") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str) -> Any:
    """``text`` parsed as YAML; a ConfigError saying where and what is wrong, as the parser says it."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None


def yaml_problem(exc: Exception) -> str:
    """``line 2, column 9: expected ',' or ']', but got '<stream end>'`` — the parser's problem, where it is."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """``byte 0xe9 at offset 18 (line 2, column 6)``: where a decoding failed, as a person finds it."""
    offset = exc.start
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"byte 0x{data[offset]:02x} at offset {offset} (line {line}, column {column})"


def secret_file(path: str, key: str) -> str:
    """The stripped contents of a secret file (a token, an API key); ConfigError naming ``key``
    when it is missing, unreadable, empty or not one printable word. The secret is never shown."""
    try:
        with open(path, encoding="utf-8") as handle:
            secret = handle.read().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text") from None
    if not secret:
        raise ConfigError(f"{key}: {path} is empty")
    if any(c.isspace() for c in secret) or not secret.isprintable() or not secret.isascii():
        raise ConfigError(f"{key}: the secret in {path} must be printable ASCII without spaces")
    return secret


def loose_permissions(path: str) -> bool:
    """True when others (not the owner or group) may read or write ``path``."""
    try:
        return bool(os.stat(path).st_mode & 0o006)
    except OSError:
        return False


def show(value: Any) -> str:
    """A short repr of an untrusted value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
