"""Which Docker engine each target lives on: the config's ``docker_hosts`` and ``docker_host``.

One webhook restarts containers on many Docker hosts, through the engines people already
run and the Docker SDK's own client per host: ``unix://`` (a local socket), ``tcp://`` (with
TLS client certificates, or plain for a socket proxy on a private network) and ``ssh://``
(the SDK's SSH transport: it needs ``paramiko``, the SDK's own extra
``pip install 'docker[ssh]'``). A target without ``docker_host`` uses the *default* engine:
``$DOCKER_HOST`` or the local socket, exactly as before.

Hosts are declared once, by name, at the top level (``docker_hosts``) and referred to by
targets, so 50 targets on 10 hosts name their TLS files 10 times, not 50. A target may also
give a URL: the declared host with that URL, or (unix, ssh, plain tcp) an undeclared engine.

Everything a host needs is checked at start-up and every error names its key: the scheme is
known, the URL has a host (and a port, for tcp), TLS files exist, are readable, are PEM, and
the key matches its certificate. Nothing is connected here: an engine that is down at start-up
is one target's 503 later, never a webhook that will not start.
"""
from __future__ import annotations

import logging
import os
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from hangwatch.settings import ConfigError, mapping, show, split_url, string

from .private import require_private

log = logging.getLogger("hangwatch.webhook")

DEFAULT = "default"  # the name of the engine a target without docker_host uses (reserved)
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SCHEMES = ("unix", "tcp", "ssh")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PEM_CERT = "-----BEGIN CERTIFICATE-----"
_MAX_PEM = 1024 * 1024


@dataclass(frozen=True)
class TLSFiles:
    ca_file: str     # the CA that signed the engine's certificate (the engine is verified)
    cert_file: str   # the webhook's client certificate (dockerd --tlsverify checks it)
    key_file: str    # its private key (never read into a log, a series or an error)


@dataclass(frozen=True)
class DockerHost:
    name: str                    # "default", a docker_hosts name, or the URL of an undeclared engine
    url: str | None = None       # None: the default engine ($DOCKER_HOST or the local socket)
    tls: TLSFiles | None = None

    @property
    def identity(self) -> str:
        """What tells two engines apart: the URL actually used (the default's from $DOCKER_HOST)."""
        return self.url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET

    @property
    def scheme(self) -> str:
        return urlsplit(self.identity).scheme


DEFAULT_HOST = DockerHost(DEFAULT)


def parse_docker_hosts(raw) -> dict[str, DockerHost]:
    """The top-level ``docker_hosts`` mapping (name → ``{url, tls}``), checked completely."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"docker_hosts: expected a mapping of names to {{url, tls}}, got {show(raw)}")
    hosts: dict[str, DockerHost] = {}
    by_url: dict[str, str] = {}
    for name, entry in raw.items():
        path = f"docker_hosts.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{path}: a host name must be letters, digits, '_', '.', '-' (at most 63)")
        if name == DEFAULT:
            raise ConfigError(f"{path}: '{DEFAULT}' is the engine of targets without docker_host "
                              "($DOCKER_HOST or the local socket); choose another name")
        data = mapping(entry, path, {"url", "tls"}, required={"url"})
        url = docker_url(data["url"], f"{path}.url")
        tls = None
        if "tls" in data:
            if urlsplit(url).scheme != "tcp":
                raise ConfigError(f"{path}.tls: only a tcp:// engine uses TLS ({url} is not one)")
            tls = tls_files(data["tls"], f"{path}.tls")
        if url in by_url:
            raise ConfigError(f"{path}.url: {url} is already docker_hosts.{by_url[url]}")
        by_url[url] = name
        _check_transport(f"{path}.url", url, tls)
        hosts[name] = DockerHost(name, url, tls)
    return hosts


def resolve(value, path: str, hosts: dict[str, DockerHost]) -> DockerHost:
    """A target's ``docker_host``: a declared name, a declared host's URL, or an undeclared URL."""
    if value is None:
        return DEFAULT_HOST
    text = string(value, path)
    if text in hosts:
        return hosts[text]
    if text == DEFAULT:
        return DEFAULT_HOST
    if "://" not in text:
        known = ", ".join(sorted(hosts)) or "none declared"
        raise ConfigError(f"{path}: {text!r} is not in docker_hosts (known: {known}) and not a URL "
                          f"({', '.join(s + '://' for s in SCHEMES)})")
    url = docker_url(text, path)
    declared = next((host for host in hosts.values() if host.url == url), None)
    if declared is not None:
        return declared
    _check_transport(path, url, None)
    return DockerHost(url, url)


def docker_url(value, path: str) -> str:
    """``unix:///absolute/path``, ``tcp://HOST:PORT`` or ``ssh://[USER@]HOST[:PORT]``; nothing else."""
    text = string(value, path).strip()
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ConfigError(f"{path}: {show(text)} contains spaces or control characters")
    parts = split_url(text, path)
    port = parts.port
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"{path}: {show(text)}: the scheme must be one of "
                          f"{', '.join(s + '://' for s in SCHEMES)}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{path}: {show(text)} must not carry a query or a fragment")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ConfigError(f"{path}: {show(text)} must be unix:///ABSOLUTE/PATH (three slashes)")
        return text
    if not parts.hostname:
        raise ConfigError(f"{path}: {show(text)} has no host")
    if parts.path.strip("/"):
        raise ConfigError(f"{path}: {show(text)} must not carry a path")
    if parts.password is not None:
        raise ConfigError(f"{path}: {show(text)} must not carry a password (use an SSH key)")
    if parts.scheme == "tcp":
        if parts.username is not None:
            raise ConfigError(f"{path}: {show(text)}: a tcp:// engine takes no user")
        if port is None or port == 0:
            raise ConfigError(f"{path}: {show(text)} must name its port (tcp://HOST:2376 with TLS)")
    return text.rstrip("/")


def tls_files(raw, path: str) -> TLSFiles:
    data = mapping(raw, path, {"ca_file", "cert_file", "key_file"}, required={"ca_file", "cert_file", "key_file"})
    ca, cert, key = (string(data[k], f"{path}.{k}") for k in ("ca_file", "cert_file", "key_file"))
    for file, key_name, what in ((ca, "ca_file", "certificate"), (cert, "cert_file", "certificate"),
                                 (key, "key_file", "private key")):
        text = _read_pem(file, f"{path}.{key_name}")
        marker = _PEM_CERT if what == "certificate" else "PRIVATE KEY-----"
        if marker not in text:
            raise ConfigError(f"{path}.{key_name}: {file} holds no PEM {what}")
    try:
        ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, ValueError):
        raise ConfigError(f"{path}.ca_file: {ca} is not a usable PEM CA certificate") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = "does not match" if "MISMATCH" in str(exc).upper() else "cannot be used with"
        raise ConfigError(f"{path}.key_file: {key} {why} {path}.cert_file {cert}") from None
    require_private(key, f"{path}.key_file", "chmod 0600 (or 0640/0440 for a group)")
    return TLSFiles(ca, cert, key)


def _read_pem(file: str, path: str) -> str:
    try:
        with open(file, "rb") as handle:
            data = handle.read(_MAX_PEM + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {file}: {exc.strerror or exc}") from None
    if len(data) > _MAX_PEM:
        raise ConfigError(f"{path}: {file} is larger than 1 MiB: not a PEM file")
    return data.decode("ascii", errors="replace")


def ssh_transport_missing() -> str | None:
    """Why the Docker SDK cannot open ``ssh://`` here (it needs paramiko), or None."""
    try:
        import paramiko  # noqa: F401  (the SDK's SSH transport imports it)
    except ImportError:
        return "ssh:// needs the paramiko package (pip install 'docker[ssh]')"
    return None


def _check_transport(path: str, url: str, tls: TLSFiles | None) -> None:
    scheme = urlsplit(url).scheme
    if scheme == "ssh":
        missing = ssh_transport_missing()
        if missing:
            raise ConfigError(f"{path}: {missing}")
    elif scheme == "tcp" and tls is None:
        log.warning("%s: %s is plain TCP: whoever reaches it controls that engine; use tls (docker_hosts) "
                    "unless it is a socket proxy on a private network", path, url)
