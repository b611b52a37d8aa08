"""Start the benchmark's processes — the backend fleet, the exporter (this tree's or an older
commit's, on either event loop), blackbox_exporter, a real Prometheus — and stop them by PID.
Nothing is left behind."""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def raise_fd_limit() -> None:
    """Thousands of targets need thousands of sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _stop(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        os.kill(popen.pid, signal.SIGTERM)
        try:
            popen.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(popen.pid, signal.SIGKILL)
            popen.wait(5)


class Fleet:
    """``bench/fleet.py``: ``count`` vLLM backends on their own ports, in one process."""

    def __init__(self, count: int, page: Path | None = None, static: bool = False):
        argv = [sys.executable, str(ROOT / "bench" / "fleet.py"), "--count", str(count)]
        if page is not None:
            argv += ["--page", str(page)]
        if static:
            argv.append("--static")
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        line = self.popen.stdout.readline()
        if not line:
            _stop(self.popen)
            raise RuntimeError("the fleet did not start")
        self.ports = json.loads(line)["ports"]
        self.pid = self.popen.pid

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def stop(self) -> None:
        _stop(self.popen)


def old_tree(ref: str, workdir: Path) -> Path:
    """``ref``'s code laid out as an importable ``hangwatch`` package (PYTHONPATH wins over
    the editable install's finder), so an older exporter runs with the same interpreter."""
    archive = workdir / "tree.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=out, check=True)
    src = workdir / "src"
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+, 3.10.12+
            tar.extractall(src, filter="data")
        else:  # Debian 12's 3.11.2: our own git archive, trusted
            tar.extractall(src)
    site = workdir / "site"
    shutil.copytree(src / "hangwatch", site / "hangwatch")
    for face in ("exporter", "simulator", "webhook"):
        if (src / face).is_dir():
            shutil.copytree(src / face, site / "hangwatch" / face)
    return site


class Exporter:
    """``hangwatch exporter`` on a free loopback port; ``ref`` runs an older commit's code;
    ``loop`` other than ``evloop`` runs it through ``bench/loopchoice.py`` on that loop."""

    def __init__(self, workdir: Path, config: str = "", ref: str | None = None, listen: str = "127.0.0.1:0",
                 loop: str = "evloop"):
        env = dict(os.environ)
        env["HANGWATCH_BENCH_LOOP"] = loop
        command = [sys.executable, str(ROOT / "bench" / "loopchoice.py")] if loop != "evloop" else \
            [sys.executable, "-m", "hangwatch"]
        if ref:
            env["PYTHONPATH"] = str(old_tree(ref, Path(tempfile.mkdtemp(dir=workdir))))
        config_path = workdir / "exporter.yml"
        config_path.write_text(config or "{}\n")
        self.log_path = workdir / "exporter.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            command + ["exporter", "--listen", listen, "--config", str(config_path)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir, env=env)
        self.pid = self.popen.pid
        deadline = time.monotonic() + 30
        while True:
            match = re.search(rb"listening on http://[^:]+:(\d+)", self.log_path.read_bytes())
            if match:
                self.port = int(match.group(1))
                break
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the exporter did not start:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        _stop(self.popen)
        self.log.close()


BLACKBOX = "prometheus-blackbox-exporter"   # Debian's package of the same name
BLACKBOX_MODULE = "vllm_metrics"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Blackbox:
    """blackbox_exporter (the reference multi-target exporter, Go) on a loopback port, with one
    http module that reads a backend's ``/metrics``: ``GET``, 200 wanted, identity encoding as
    hangwatch asks. It reads the body whole (to count its bytes) and looks at nothing in it:
    the cheapest honest reading, so the ratio is the strict one. Probe ``/probe?target=http://host:port/metrics&module=vllm_metrics``."""

    def __init__(self, workdir: Path, binary: str | None = None):
        binary = binary or shutil.which(BLACKBOX) or shutil.which("blackbox_exporter")
        if binary is None:
            raise RuntimeError(f"{BLACKBOX} is not installed (Debian: apt-get install -y {BLACKBOX})")
        config = workdir / "blackbox.yml"
        config.write_text(
            "modules:\n"
            f"  {BLACKBOX_MODULE}:\n"
            "    prober: http\n"
            "    timeout: 10s\n"
            "    http:\n"
            "      method: GET\n"
            "      valid_status_codes: [200]\n"
            "      preferred_ip_protocol: ip4\n"
            "      headers:\n"
            "        Accept-Encoding: identity\n")
        self.port = free_port()
        self.log_path = workdir / "blackbox.log"
        self.log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--log.level=warn"], stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        self.pid = self.popen.pid
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                pass
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"blackbox_exporter did not start:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        _stop(self.popen)
        self.log.close()
