"""A pinned target: its processes named by the deployment, not found from a port number.

When the URL alone is ambiguous (two network namespaces own the address, a wildcard bind in each)
or the server sits where its sockets cannot be read, the config says where its processes are:
a ``pid_file`` (the server's main PID; it and its descendants), a ``cgroup`` (every PID in its
``cgroup.procs``: a systemd unit's ``/sys/fs/cgroup/system.slice/vllm.service``) or a
``container`` (a Docker container ID or ID prefix: the processes whose ``/proc/PID/cgroup``
names it). Each resolver returns root PIDs; ``processes.find_pinned`` adds the descendants.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Pin:
    pid_file: str | None = None
    cgroup: str | None = None
    container: str | None = None

    def describe(self) -> str:
        if self.pid_file:
            return f"pid_file {self.pid_file}"
        if self.cgroup:
            return f"cgroup {self.cgroup}"
        return f"container {self.container}"


class PinError(Exception):
    """The pinned processes cannot be read; the message says why."""


def pinned_roots(pin: Pin, proc: str = "/proc") -> list[int]:
    if pin.pid_file:
        return [_pid_from_file(pin.pid_file)]
    if pin.cgroup:
        return _cgroup_procs(pin.cgroup)
    return container_pids(pin.container or "", proc)


def _pid_from_file(path: str) -> int:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(64).strip()
    except OSError as exc:
        raise PinError(f"pid_file {path}: {exc.strerror or exc}") from None
    if not text.isdigit() or int(text) <= 1:
        raise PinError(f"pid_file {path}: does not hold a process id")
    return int(text)


def _cgroup_procs(cgroup: str) -> list[int]:
    directory = cgroup if cgroup.startswith(CGROUP_ROOT) else os.path.join(CGROUP_ROOT, cgroup.lstrip("/"))
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as handle:
            found = sorted(int(line) for line in handle if line.strip().isdigit())
    except OSError as exc:
        raise PinError(f"cgroup {directory}: {exc.strerror or exc}") from None
    if not found:
        raise PinError(f"cgroup {directory}: no process in it (the server is not running?)")
    return found


def container_pids(container_id: str, proc: str = "/proc") -> list[int]:
    """The processes whose cgroup names the container (cgroupfs ``/docker/ID``, systemd ``docker-ID.scope``)."""
    if not CONTAINER_ID.fullmatch(container_id or ""):
        raise PinError("container: expected a Docker container ID (12 to 64 hex digits)")
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/cgroup", encoding="utf-8", errors="replace") as handle:
                text = handle.read(8192)
        except OSError:
            continue
        if any(_names_container(line.rpartition(":")[2], container_id) for line in text.splitlines()):
            found.append(int(name))
    if not found:
        raise PinError(f"container {container_id[:12]}: no process of it is visible here")
    return sorted(found)


def _names_container(cgroup_path: str, container_id: str) -> bool:
    for part in cgroup_path.split("/"):
        part = part.removeprefix("docker-").removesuffix(".scope")
        if len(part) == 64 and part.startswith(container_id):
            return True
    return False
