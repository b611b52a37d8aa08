"""What the webhook asks of a Docker host, and the real one: Docker through its SDK.

The policy decides; a *restarter* only finds a container, reports its state, restarts it with a stop
timeout and reads its log tail, so tests and the demo hand ``create_app`` their own and only ``main``
builds ``DockerRestarter`` (one per host, its client made on first use and again after a failure).
It makes only the Docker API calls the compose file's socket proxy lets through (tests/test_compose.py
checks), and addresses a container by the ID found under its exact name: Docker resolves a bare name
by ID prefix too, which could reach another container.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from .hosts import DockerHost
from .payload import parse_rfc3339

DOCKER_TIMEOUT = 10.0  # seconds per Docker API call; a restart gets its stop timeout on top


class ContainerNotFound(Exception):
    """Docker answered: no container has this name."""


class DockerError(Exception):
    """The Docker host did not answer usefully (unreachable, timed out, 5xx): a retry may help."""


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    status: str                  # Docker's State.Status: running, restarting, exited, paused, ...
    running: bool
    restarting: bool
    paused: bool
    started_at: datetime | None  # aware UTC; None if it never started or Docker gave nothing usable
    started_at_text: str | None  # as Docker wrote it (for the incident record)


class Restarter(Protocol):
    def find(self, name: str) -> Container:
        """The container named exactly ``name``; ContainerNotFound or DockerError otherwise."""

    def restart(self, container: Container, stop_timeout: float) -> None:
        """Restart it (SIGTERM, then SIGKILL after ``stop_timeout`` s); raises on failure."""

    def log_tail(self, container: Container, lines: int) -> list[str]:
        """Its last ``lines`` log lines (stdout and stderr, with timestamps); raises on failure."""


def container_from_inspect(attrs: dict) -> Container:
    """A ``Container`` from Docker's ``GET /containers/{id}/json`` answer."""
    state = attrs.get("State") or {}
    text = state.get("StartedAt")
    started = None
    if isinstance(text, str):
        try:
            started = parse_rfc3339(text)
        except ValueError:
            started = None
        if started is not None and started.year < 2000:  # "0001-01-01T00:00:00Z": never started
            started = None
    return Container(id=str(attrs.get("Id") or ""), name=str(attrs.get("Name") or "").lstrip("/"),
                     status=str(state.get("Status") or "unknown"), running=bool(state.get("Running")),
                     restarting=bool(state.get("Restarting")), paused=bool(state.get("Paused")),
                     started_at=started, started_at_text=text if isinstance(text, str) else None)


def docker_api(host: DockerHost | None, timeout: float = DOCKER_TIMEOUT):
    """The Docker SDK's own API client for one host, its API version asked of the host.

    A host from the config uses only what the config says: the requests session ignores the
    environment (``trust_env``). Otherwise ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``, which
    many machines set, replaces the configured ``ca_file`` on every call and the host's
    certificate fails to verify ("unable to get local issuer certificate"), and an
    ``HTTPS_PROXY`` would carry the Docker API through a proxy."""
    import docker
    if host is None or host.url is None:
        return docker.from_env(timeout=timeout).api  # $DOCKER_HOST, $DOCKER_TLS_VERIFY, $DOCKER_CERT_PATH
    options: dict = {"base_url": host.url, "timeout": timeout}
    if host.tls is not None:
        options["tls"] = docker.tls.TLSConfig(client_cert=(host.tls.cert_file, host.tls.key_file),
                                              ca_cert=host.tls.ca_file, verify=True)
    if host.url.startswith("ssh://"):
        options["use_ssh_client"] = False  # paramiko: known_hosts enforced, ~/.ssh/config read
    asking = docker.APIClient(version=docker.constants.MINIMUM_DOCKER_API_VERSION, **options)
    asking.trust_env = False
    try:
        version = asking.version(api_version=False)["ApiVersion"]
    finally:
        asking.close()
    api = docker.APIClient(version=version, **options)
    api.trust_env = False
    return api


def docker_restarters(config, timeout: float = DOCKER_TIMEOUT) -> dict[str, "DockerRestarter"]:
    """One ``DockerRestarter`` per Docker host a target lives on, by host name."""
    return {host.name: DockerRestarter(host=host, timeout=timeout) for host in config.hosts}


class DockerRestarter:
    """The Docker API of one host through the Docker SDK; the host is reached on first
    use (and again after a failure), so the webhook may start before it."""

    def __init__(self, client=None, *, host: DockerHost | None = None, timeout: float = DOCKER_TIMEOUT):
        self._api_client = client.api if client is not None else None  # a docker.DockerClient, or made here
        self._host = host
        self._timeout = timeout
        self._lock = threading.Lock()

    def _api(self):
        with self._lock:
            if self._api_client is None:
                try:
                    self._api_client = docker_api(self._host, self._timeout)
                except Exception as exc:  # unreachable now; the next call tries again
                    where = self._host.name if self._host else "default"
                    raise DockerError(f"docker host {where}: {type(exc).__name__}: {str(exc)[:200]}") from exc
            return self._api_client

    def find(self, name: str) -> Container:
        from docker.errors import NotFound
        try:
            api = self._api()
            listed = api.containers(all=True, filters={"name": "^/" + name.replace(".", r"\.") + "$"})
            ids = [c.get("Id") for c in listed if "/" + name in (c.get("Names") or [])]
            if not ids:
                raise ContainerNotFound(name)
            attrs = api.inspect_container(ids[0])
        except ContainerNotFound:
            raise
        except NotFound:  # removed between the list and the inspect
            raise ContainerNotFound(name) from None
        except DockerError:
            raise
        except Exception as exc:  # ConnectionError, APIError 5xx, timeouts, DockerException
            raise DockerError(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        container = container_from_inspect(attrs)
        if container.name != name:
            raise ContainerNotFound(name)
        return container

    def restart(self, container: Container, stop_timeout: float) -> None:
        self._api().restart(container.id, timeout=int(math.ceil(stop_timeout)))

    def log_tail(self, container: Container, lines: int) -> list[str]:
        raw = self._api().logs(container.id, stdout=True, stderr=True, timestamps=True, tail=lines)
        return raw.decode("utf-8", errors="replace").splitlines()[-lines:]
