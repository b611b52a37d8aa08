"""Which Docker host each target lives on: the config's ``docker_hosts`` and ``docker_host``.

One webhook restarts containers on many Docker hosts through the Docker daemons people already run
(``unix://``, ``tcp://`` with TLS client certificates, ``ssh://``), declared once by name so 50 targets
on 10 hosts name their TLS files 10 times. Everything a host needs is checked at start-up, each error
naming its key, but nothing is connected: a host down at start-up is one target's 503 later. Plain
``tcp://`` hands the host to whoever reaches the port, so it is refused unless ``insecure_tcp: true``.
"""
from __future__ import annotations

import logging
import os
import re
import ssl
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from hangwatch.settings import ConfigError, boolean, mapping, show, split_url, string

from .private import require_private

log = logging.getLogger("hangwatch.webhook")

DEFAULT = "default"  # the name of the Docker host a target without docker_host uses (reserved)
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SCHEMES = ("unix", "tcp", "ssh")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PEM_CERT = "-----BEGIN CERTIFICATE-----"
_MAX_PEM = 1024 * 1024


@dataclass(frozen=True)
class TLSFiles:
    ca_file: str     # the CA that signed the Docker host's certificate (the host is verified)
    cert_file: str   # the webhook's client certificate (dockerd --tlsverify checks it)
    key_file: str    # its private key (never read into a log, a series or an error)


@dataclass(frozen=True)
class DockerHost:
    name: str                    # "default", a docker_hosts name, or the URL of an undeclared Docker host
    url: str | None = None       # None: the default Docker host ($DOCKER_HOST or the local socket)
    tls: TLSFiles | None = None
    insecure_tcp: bool = False   # docker_hosts.<name>.insecure_tcp: plain tcp:// accepted for it

    @property
    def identity(self) -> str:
        """What tells two Docker hosts apart: the URL actually used (the default's from $DOCKER_HOST)."""
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
            raise ConfigError(f"{path}: '{DEFAULT}' is the Docker host of targets without docker_host "
                              "($DOCKER_HOST or the local socket); choose another name")
        data = mapping(entry, path, {"url", "tls", "insecure_tcp"}, required={"url"})
        url = docker_url(data["url"], f"{path}.url")
        tls = None
        if "tls" in data:
            if urlsplit(url).scheme != "tcp":
                raise ConfigError(f"{path}.tls: only a tcp:// Docker host uses TLS ({url} is not one)")
            tls = tls_files(data["tls"], f"{path}.tls")
        insecure = boolean(data.get("insecure_tcp", False), f"{path}.insecure_tcp")
        if insecure and (tls is not None or urlsplit(url).scheme != "tcp"):
            raise ConfigError(f"{path}.insecure_tcp: only for a plain tcp:// Docker host without tls ({url} "
                              f"{'has tls' if tls is not None else 'is not tcp://'})")
        if url in by_url:
            raise ConfigError(f"{path}.url: {url} is already docker_hosts.{by_url[url]}")
        by_url[url] = name
        _check_transport(f"{path}.url", url)
        hosts[name] = DockerHost(name, url, tls, insecure)
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
    _check_transport(path, url)
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
            raise ConfigError(f"{path}: {show(text)}: a tcp:// Docker host takes no user")
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


def _check_transport(path: str, url: str) -> None:
    if urlsplit(url).scheme == "ssh":
        missing = ssh_transport_missing()
        if missing:
            raise ConfigError(f"{path}: {missing}")


def require_tls(host: DockerHost, insecure_tcp: bool, path: str, env: Mapping[str, str]) -> None:
    """A target's Docker host is reached with TLS, or someone said ``insecure_tcp: true`` for it;
    ConfigError at ``path`` (the target's ``docker_host``) otherwise."""
    if host.url is None:  # the default Docker host: Docker's own variables decide, as the SDK reads them
        url = env.get("DOCKER_HOST") or DEFAULT_SOCKET
        plain = urlsplit(url).scheme == "tcp" and not env.get("DOCKER_TLS_VERIFY")
        where = f"the default Docker host, $DOCKER_HOST={url}, is plain TCP ($DOCKER_TLS_VERIFY is not set)"
        fix = "set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH, or say insecure_tcp: true on this target"
    else:
        url = host.url
        plain = urlsplit(url).scheme == "tcp" and host.tls is None
        declared = host.name != url
        where = f"docker_hosts.{host.name} ({url}) is plain TCP" if declared else f"{url} is plain TCP"
        fix = (f"give docker_hosts.{host.name} tls, or say insecure_tcp: true there or on this target" if declared
               else "declare it in docker_hosts with tls, or say insecure_tcp: true on this target")
    if not plain:
        if insecure_tcp and host.url is not None:
            raise ConfigError(f"{path}: insecure_tcp: true, but {url} is not plain tcp:// (remove it)")
        return
    if insecure_tcp or host.insecure_tcp:
        log.info("%s: %s is plain TCP (insecure_tcp: true): whoever reaches it controls that Docker host", path, url)
        return
    raise ConfigError(f"{path}: {where}: whoever reaches that port controls the Docker host; {fix} "
                      "(only for a socket proxy on a private network)")
