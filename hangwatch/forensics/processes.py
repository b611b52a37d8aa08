"""Which processes are the server behind a URL: its listener, where the address is the server's, and descendants.

A port number is not a server: another container may listen on the same one. So the listener
is looked for only where the URL's address lives — a loopback address in the exporter's own
network namespace (``/proc/self/ns/net``), any other address in the namespaces that own it
(``/proc/PID/net/fib_trie``, ``if_inet6``) — bound to that address (a wildcard only when none
is), then the processes of that namespace holding the socket (``/proc/PID/fd``), then their
children (EngineCore, workers). More than one namespace is refused as ambiguous unless the
deployment pins the target (``pins``). Every unreadable file is a reason recorded, never an
exception: the capture must say why it saw nothing.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

from ..scrub import REDACTED, SECRET_WORDS, redact_argv  # noqa: F401 (the names forensics used)
from .pins import Pin, PinError, container_pids, pinned_roots

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
CLOSE_WAIT = "08"
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # this network namespace's, IPv4 and IPv6
SECRET_FLAGS = SECRET_WORDS


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    ppid: int
    name: str
    state: str          # /proc/PID/stat's state letter: R, S, D, T (stopped), t (traced), Z ...
    cmdline: tuple[str, ...]
    netns: str | None = None  # net:[INODE]: recorded with every capture


@dataclass
class Found:
    processes: list[ServerProcess] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_read: int = 0  # processes past the limit


def port_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


def read_stat(pid: int, proc: str = "/proc") -> tuple[str, int, str] | None:
    """(comm, ppid, state) from /proc/PID/stat, or None once the process is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    head, _, tail = text.rpartition(")")  # the name may itself hold ") "
    comm = head.partition("(")[2]
    fields = tail.split()
    if len(fields) < 2:
        return None
    try:
        return comm, int(fields[1]), fields[0]
    except ValueError:
        return None


def read_cmdline(pid: int, proc: str = "/proc") -> tuple[str, ...]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            raw = handle.read(16384)
    except OSError:
        return ()
    return redact_argv(tuple(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0") if a))


def process_name(pid: int, comm: str, cmdline: tuple[str, ...]) -> str:
    """A process title set with setproctitle (``VLLM::EngineCore``) when there is one, else comm."""
    if len(cmdline) == 1 and "/" not in cmdline[0] and " " not in cmdline[0].strip():
        return cmdline[0].strip()
    if cmdline and "::" in cmdline[0]:
        return cmdline[0].split()[0]
    return comm


def pids(proc: str = "/proc") -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return []


def socket_rows(table: str) -> Iterator[tuple[str, int, str, str]]:
    """(local address in hex, local port, state, inode) of each socket in one /proc/net/tcp{,6} table.
    The one reader of these tables (forensics, the test harness, the benchmarks): an unreadable table
    has no rows and a malformed line is skipped."""
    try:
        with open(table, encoding="ascii", errors="replace") as handle:
            next(handle, None)
            for line in handle:
                fields = line.split()
                if len(fields) < 10:
                    continue
                address, _, hexport = fields[1].partition(":")
                try:
                    port = int(hexport, 16)
                except ValueError:
                    continue
                yield address, port, fields[3], fields[9]
    except OSError:
        return


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def host_addresses(host: str) -> set[str] | None:
    """The addresses a URL's host stands for, each in its one spelling; None: it resolves to nothing."""
    if not host:
        return None
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    wanted: set[str] = set()
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        address = getattr(address, "ipv4_mapped", None) or address
        wanted.add(str(address))
    return wanted or None


def netns_of(pid: int | str, proc: str = "/proc") -> str | None:
    """``net:[INODE]`` of a process's network namespace (None: not ours to read)."""
    try:
        return os.readlink(f"{proc}/{pid}/ns/net")
    except OSError:
        return None


def local_addresses(net_dir: str) -> set[str]:
    """The addresses a network namespace owns: ``fib_trie``'s ``/32 host LOCAL`` rows and ``if_inet6``."""
    owned: set[str] = set()
    last = None
    try:
        with open(f"{net_dir}/fib_trie", encoding="ascii", errors="replace") as handle:
            for line in handle:
                text = line.strip()
                if text.startswith(("|--", "+--")):
                    last = text[3:].split()[0]
                elif text.startswith("/32 host LOCAL") and last:
                    owned.add(last)
    except OSError:
        pass
    try:
        with open(f"{net_dir}/if_inet6", encoding="ascii", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if fields and len(fields[0]) == 32:
                    owned.add(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    except (OSError, ValueError):
        pass
    return owned


def _namespaces(everyone: list[int], proc: str) -> dict[str, tuple[str, list[int]]]:
    """netns -> (a /proc/.../net directory that shows it, its PIDs); our own namespace first."""
    own = netns_of("self", proc) or "self"
    spaces: dict[str, tuple[str, list[int]]] = {own: (f"{proc}/self/net", [])}
    for pid in everyone:
        netns = netns_of(pid, proc)
        if netns is None:  # not ours to read: its sockets show only if it shares a namespace we read
            continue
        spaces.setdefault(netns, (f"{proc}/{pid}/net", []))[1].append(pid)
    return spaces


def find_server(url: str, proc: str = "/proc", *, pin: Pin | None = None, container: str | None = None,
                container_trusted: bool = False, limit: int | None = None) -> Found:
    """The server's processes, roots first, then all their descendants.

    ``pin`` (the deployment's word) names them outright. Otherwise the listener on the URL's
    address and port, and only where that address is the server's: a loopback address in the
    exporter's own network namespace alone, any other address only in the namespaces that own
    it — a namespace more than one of those answers is refused as ambiguous (pin the target).
    ``container`` (the ID the webhook knows): that container's own processes when the caller
    proved it is the webhook (``container_trusted``: the bearer token; a port published by
    Docker lives in the container's namespace, not the exporter's); from any other caller it
    only narrows what the URL found (the listener must be the container's). ``limit``:
    at most that many processes (the rest counted in ``not_read``)."""
    found = Found()
    everyone = pids(proc)
    if pin is not None:
        try:
            roots = pinned_roots(pin, proc)
        except PinError as exc:
            found.errors.append(str(exc))
            return found
        return _with_descendants(found, roots, everyone, proc, limit)
    host, port = port_of(url)
    wanted = host_addresses(host)
    if not wanted:
        found.errors.append("the target's host does not resolve: no process can be named")
        return found
    spaces = _namespaces(everyone, proc)
    loopback = all(ipaddress.ip_address(a).is_loopback for a in wanted)
    if loopback:
        candidates = dict(list(spaces.items())[:1])
    else:
        candidates = {ns: place for ns, place in spaces.items() if wanted & local_addresses(place[0])}
    members = None
    if container is not None:
        try:
            members = set(container_pids(container, proc))
        except PinError as exc:
            found.errors.append(str(exc))
            return found
        if container_trusted:
            return _container(found, container, members, everyone, proc, limit)
    listening: dict[str, set[str]] = {}
    for netns, (directory, _) in candidates.items():
        inodes = _listeners(directory, port, wanted)
        if inodes:
            listening[netns] = inodes
    if not listening:
        where = "this network namespace" if loopback else "any network namespace that owns the address"
        found.errors.append(f"no socket listening on port {port} is visible in {where}: the server runs in another "
                            f"PID namespace (compose: pid: \"service:<server>\"; Kubernetes: shareProcessNamespace), "
                            f"on another host, or elsewhere (pin it: forensics.pins[].pid_file, cgroup or container)")
        return found
    if len(listening) > 1:
        found.errors.append(f"refused: {len(listening)} network namespaces listen on port {port} for this address "
                            "(ambiguous: pin the target with forensics.pins[].pid_file, cgroup or container)")
        return found
    ((netns, inodes),) = listening.items()
    targets = {f"socket:[{inode}]" for inode in inodes}
    roots: list[int] = []
    unreadable = 0
    for pid in spaces[netns][1]:
        if members is not None and pid not in members:
            continue
        try:
            names = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            unreadable += 1
            continue
        for name in names:
            try:
                if os.readlink(f"{proc}/{pid}/fd/{name}") in targets:
                    roots.append(pid)
                    break
            except OSError:
                continue
    if not roots and members is not None:
        found.errors.append(f"refused: no process of container {container[:12]} holds the target's listener")
        return found
    if not roots:
        found.errors.append(f"a socket listens on port {port} but no process holding it could be read "
                            f"({unreadable} processes' /proc/PID/fd unreadable: no permission, run as the server's "
                            f"user or root)")
        return found
    return _with_descendants(found, roots, everyone, proc, limit)


def _container(found: Found, container: str, members: set[int], everyone: list[int], proc: str,
               limit: int | None) -> Found:
    """The container's own processes (its cgroup names it): the webhook knows the container, so no
    port number is read."""
    roots = sorted(members)
    parents = {pid: (read_stat(pid, proc) or ("", 0, ""))[1] for pid in roots}
    return _with_descendants(found, [pid for pid in roots if parents[pid] not in members], everyone, proc, limit)


def _listeners(directory: str, port: int, wanted: set[str]) -> set[str]:
    """The sockets the kernel would hand a connection to: bound to the address, else a wildcard."""
    exact: set[str] = set()
    wildcard: set[str] = set()
    for table in ("tcp", "tcp6"):
        for address, bound_port, state, inode in socket_rows(f"{directory}/{table}"):
            if state != LISTEN or bound_port != port:
                continue
            try:
                bound = _address(address)
            except ValueError:
                continue
            if str(bound) in wanted:
                exact.add(inode)
            elif bound.is_unspecified:
                wildcard.add(inode)
    return exact or wildcard


def _with_descendants(found: Found, roots: list[int], everyone: list[int], proc: str, limit: int | None) -> Found:
    stats = {pid: read_stat(pid, proc) for pid in everyone}
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        if stat is not None:
            children.setdefault(stat[1], []).append(pid)
    order: list[int] = []
    queue = sorted(set(roots))
    while queue:
        pid = queue.pop(0)
        if pid in order or (pid == os.getpid() and pid not in roots):  # not the capture itself, run from the server
            continue
        order.append(pid)
        queue.extend(sorted(children.get(pid, ())))
    if limit is not None and len(order) > limit:
        found.not_read = len(order) - limit
        order = order[:limit]
    for pid in order:
        stat = read_stat(pid, proc) or stats.get(pid)
        if stat is None:
            continue
        comm, ppid, state = stat
        cmdline = read_cmdline(pid, proc)
        found.processes.append(ServerProcess(pid, ppid, process_name(pid, comm, cmdline), state, cmdline,
                                             netns_of(pid, proc)))
    return found
