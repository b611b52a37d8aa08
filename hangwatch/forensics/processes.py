"""Which processes are the server behind a URL: the one listening on its port, and all its descendants.

Nothing but the URL is configured, so the processes are found the way ``ss -ltp`` finds them:
the listening sockets on the URL's port (``/proc/PID/net/tcp`` and ``tcp6`` — read per network
namespace, so a capture from a container sharing only the server's PID namespace still sees
the server's sockets), then the processes holding those socket inodes (``/proc/PID/fd``), then
their children, grandchildren and so on (EngineCore, workers). Every unreadable file is a
reason recorded, never an exception: the capture must say why it saw nothing.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
CLOSE_WAIT = "08"
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # this network namespace's, IPv4 and IPv6
SECRET_FLAGS = ("key", "token", "secret", "password", "passwd", "credential", "auth")
REDACTED = "<redacted>"


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    ppid: int
    name: str
    state: str          # /proc/PID/stat's state letter: R, S, D, T (stopped), t (traced), Z ...
    cmdline: tuple[str, ...]


@dataclass
class Found:
    processes: list[ServerProcess] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


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


def redact_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``--api-key KEY`` and ``--hf-token=KEY``: the values never leave this function."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        secret = arg.startswith("-") and any(word in flag.lower() for word in SECRET_FLAGS)
        if secret and eq:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(arg)
            hide_next = secret
    return tuple(out)


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


def listening_inodes(table: str, port: int, wanted: set[str] | None) -> set[str]:
    """Socket inodes listening on ``port`` in one /proc/PID/net/tcp{,6} table.
    ``wanted``: the addresses the URL's host names (a wildcard bind always matches)."""
    inodes: set[str] = set()
    for address, bound_port, state, inode in socket_rows(table):
        if state != LISTEN or bound_port != port:
            continue
        try:
            bound = _address(address)
        except ValueError:
            continue
        if wanted is None or bound.is_unspecified or str(bound) in wanted or \
                (bound.is_loopback and "loopback" in wanted):
            inodes.add(inode)
    return inodes


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def host_addresses(host: str) -> set[str] | None:
    """The addresses a URL's host stands for ("loopback" for any 127/8 or ::1); None: any."""
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
        wanted.add("loopback" if address.is_loopback else str(address))
    return wanted


def find_server(url: str, proc: str = "/proc") -> Found:
    """The listening process(es) of ``url``'s port and all their descendants, roots first."""
    found = Found()
    host, port = port_of(url)
    wanted = host_addresses(host)
    everyone = pids(proc)
    inodes: set[str] = set()
    tables = [f"{proc}/self/net"]  # our own network namespace, then each other one once
    try:
        seen_netns = {os.readlink(f"{proc}/self/ns/net")}
    except OSError:
        seen_netns = set()
    for pid in everyone:
        try:
            netns = os.readlink(f"{proc}/{pid}/ns/net")
        except OSError:  # not ours to read: its sockets show only if it shares a namespace we read
            continue
        if netns not in seen_netns:
            seen_netns.add(netns)
            tables.append(f"{proc}/{pid}/net")
    for directory in tables:
        for table in ("tcp", "tcp6"):
            inodes |= listening_inodes(f"{directory}/{table}", port, wanted)
    if not inodes:
        found.errors.append(f"no socket listening on port {port} is visible here: the server runs in another "
                            f"PID namespace (compose: pid: \"service:<server>\"; Kubernetes: shareProcessNamespace) "
                            f"or on another host")
        return found
    targets = {f"socket:[{inode}]" for inode in inodes}
    roots: list[int] = []
    unreadable = 0
    for pid in everyone:
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
    if not roots:
        found.errors.append(f"a socket listens on port {port} but no process holding it could be read "
                            f"({unreadable} processes' /proc/PID/fd unreadable: no permission, run as the server's "
                            f"user or root)")
        return found
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
    for pid in order:
        stat = read_stat(pid, proc) or stats.get(pid)
        if stat is None:
            continue
        comm, ppid, state = stat
        cmdline = read_cmdline(pid, proc)
        found.processes.append(ServerProcess(pid, ppid, process_name(pid, comm, cmdline), state, cmdline))
    return found
