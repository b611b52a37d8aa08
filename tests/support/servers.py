"""``hangwatch exporter`` and ``hangwatch webhook`` as real processes, for the tests that need a
process: signals, exit codes, log output, the image's health check.

The server binds port 0 and the test reads the port back from its "listening on" log line
(or, when a test silences that line, is given a port it found free).
"""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hangwatch.demo.files import private_file
from hangwatch.demo.processes import listening_ports
from hangwatch.demo.wait import WaitTimeout, wait_until
from harness import REPO
from harness.ports import free_port  # noqa: F401  (the tests that silence the log line take a port from here)

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
TOKEN = "proc-token-0123456789-0123456789-abc"


def webhook_config(tmp_path: Path, **extra) -> Path:
    token = private_file(tmp_path / "token", TOKEN + "\n")
    config = tmp_path / "webhook.yml"
    config.write_text(json.dumps({"token_file": str(token), "state_dir": str(tmp_path / "state"), "targets": [
        {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:9"}], **extra}))
    return config


class ServerProcess:
    """``python -m hangwatch COMMAND ARGS --listen 127.0.0.1:PORT``; stderr is collected line by line."""

    def __init__(self, command: str, *args: str, port: int = 0, env: dict | None = None, timeout: float = 20):
        self.command = command
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hangwatch", command, *args, "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = port or self._port_from_log(timeout)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_connectable(timeout)

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def _alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.command} exited with {self.process.returncode}:\n{self.log()}")

    def _port_from_log(self, timeout: float) -> int:
        def said():
            self._alive()
            return next((int(m.group(1)) for m in map(LISTENING.search, list(self.lines)) if m), None)
        try:
            return wait_until(said, timeout, f"{self.command} to say where it listens", interval=0.02)
        except (WaitTimeout, AssertionError):
            self.kill()
            raise

    def _wait_connectable(self, timeout: float) -> None:
        def accepts():
            self._alive()
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            # Accepted by this process: on a port it was given, someone else may hold it.
            return self.port in listening_ports(self.process.pid)
        try:
            wait_until(accepts, timeout, f"{self.command} accepting on {self.port}", interval=0.02, ignore=(OSError,))
        except (WaitTimeout, AssertionError):
            self.kill()
            raise

    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self, signum: int | None = signal.SIGTERM, timeout: float = 10) -> tuple[int, float]:
        """Send ``signum`` (None: send nothing, a signal is already on its way); (exit code,
        seconds until the process was gone)."""
        started = time.monotonic()
        if signum is not None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.command} still running {timeout}s after signal {signum}:\n{self.log()}")
        seconds = time.monotonic() - started
        self._reader.join(5)
        return code, seconds

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
