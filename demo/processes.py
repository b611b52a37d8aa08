"""A server process started by the demo or a test: its own log, its real port, stopped by PID.

:class:`Process` starts one command in its own session (process group) with its output in a
log file, finds the port it listens on (started on port 0: :func:`listening_ports`), waits
until it answers, and stops it by PID — SIGCONT first (a stopped process cannot handle
SIGTERM), SIGTERM to its group, SIGKILL after a deadline. It also dies with the Python
process that started it (PR_SET_PDEATHSIG), so a killed test run leaves nothing behind.

A server that must be told its port before it binds (a FastChat worker, vLLM) is started on
``ports.free_port()`` and started again on another port when ``ports.address_in_use`` finds
the bind failure in its log (``harness.ports``); see ``tests/real_fastchat/fleet.py`` and
``harness/vllm_server.py``.

A port picked by binding port 0, closing it and handing the number to a child process is free only
until someone else takes it (under load a client connection's ephemeral port did), so a server that
can bind port 0 is started on port 0 and :func:`listening_ports` reads the port it bound from /proc
(its socket inodes, matched in /proc/net/tcp): no log parsing, no cooperation from the server.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable

import requests

from hangwatch.forensics.processes import LISTEN, TCP_TABLES, socket_rows

from .wait import wait_until

try:  # loaded here, not in the forked child (no imports between fork and exec)
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """For the child before exec: ``sig`` when the thread that started it ends (start servers
    from a thread that lives as long as they should: pytest's main thread)."""
    def arm() -> None:
        if _prctl is not None:
            _prctl(1, sig)  # PR_SET_PDEATHSIG
    return arm


def stop_popen(popen: subprocess.Popen, timeout: float = 10.0) -> None:
    """One process (not its group): SIGCONT + SIGTERM, SIGKILL after ``timeout``; idempotent.
    For servers a test starts with its own ``Popen`` (sshd, a second dockerd, the webhook)."""
    if popen.poll() is None:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            popen.send_signal(sig)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(10)


class ProcessExited(RuntimeError):
    """The process ended while we waited for it."""


class Process:
    """One command running in its own process group, output in ``log_path``."""

    def __init__(self, name: str, argv: list[str], log_path: Path | str, *, env: dict | None = None,
                 cwd: Path | str | None = None, port: int | None = None, death_signal: int = signal.SIGTERM):
        self.name, self.argv, self.log_path = name, list(argv), Path(log_path)
        self.env, self.cwd, self.death_signal = env, cwd, death_signal
        self.port = port          # known in advance, or found by wait_port()
        self.popen: subprocess.Popen | None = None
        self._offset = 0

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> "Process":
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self.cwd, env=self.env,
                                          start_new_session=True,
                                          preexec_fn=_die_with_parent(self.death_signal))
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} not started"
        return self.popen.pid

    @property
    def url(self) -> str:
        assert self.port, f"{self.name}: port not known yet (wait_port)"
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> bool:
        """True, or ProcessExited with the log's tail."""
        if not self.alive():
            code = None if self.popen is None else self.popen.returncode
            raise ProcessExited(f"{self.name} exited with {code}:\n{self.log_tail()}")
        return True

    def wait_port(self, deadline: float = 30.0) -> int:
        """The port the process listens on (it was started on port 0)."""
        def bound():
            self.check_alive()
            ports = listening_ports(self.pid)
            if len(ports) > 1:
                raise AssertionError(f"{self.name} listens on several ports {ports}: say which")
            return ports[0] if ports else None
        self.port = wait_until(bound, deadline, f"{self.name} to listen", interval=0.05)
        return self.port

    def wait_ready(self, path: str, deadline: float = 30.0,
                   ready: Callable[[requests.Response], bool] = lambda r: r.status_code == 200) -> "Process":
        """Wait until ``GET url+path`` satisfies ``ready``, answered by this process itself."""
        if self.port is None:
            self.wait_port(deadline)

        def answers():
            self.check_alive()
            if not ready(requests.get(self.url + path, timeout=2)):
                return False
            # The answer came from our process, not from whoever else holds the port.
            return self.port in listening_ports(self.pid)
        wait_until(answers, deadline, f"{self.name} at {self.url}{path}", interval=0.1,
                   ignore=(requests.RequestException,))
        return self

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGCONT + SIGTERM to the process group, SIGKILL after ``timeout``; idempotent."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                _killpg(self.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(self.pid, signal.SIGKILL)
                self.popen.wait(10)
        _killpg(self.pid, signal.SIGKILL)  # children left in the group (none, normally)

    # -- the log ------------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")

    def new_lines(self) -> list[str]:
        """Whole log lines written since the last call."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode("utf-8", "replace").splitlines()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_server(name: str, argv: list[str], log_path: Path | str, ready_path: str, *,
                 deadline: float = 30.0, env: dict | None = None, cwd: Path | str | None = None) -> Process:
    """Start a server whose ``argv`` binds port 0, find its port, wait until it answers."""
    process = Process(name, argv, log_path, env=env, cwd=cwd).start()
    try:
        return process.wait_ready(ready_path, deadline)
    except BaseException:
        process.stop()
        raise


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_ports(pid: int) -> list[int]:
    """TCP ports process ``pid`` listens on (IPv4 and IPv6), lowest first."""
    inodes = _socket_inodes(pid)
    return sorted({port for table in TCP_TABLES for _, port, state, inode in socket_rows(table)
                   if state == LISTEN and inode in inodes})
