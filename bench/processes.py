"""Start the benchmark's processes — the backend fleet, the exporter (this tree's or an older
commit's, on either event loop), blackbox_exporter, a real Prometheus — and stop them by PID.
Nothing is left behind."""
from __future__ import annotations

import http.client
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
    """``bench/fleet.py``: ``count`` vLLM backends on their own ports, in one process;
    ``kind`` busy (counters moving) or idle (nothing in flight: hangwatch probes it)."""

    def __init__(self, count: int, page: Path | None = None, static: bool = False, kind: str = "busy"):
        self.kind = kind
        argv = [sys.executable, str(ROOT / "bench" / "fleet.py"), "--count", str(count), "--kind", kind]
        if page is not None:
            argv += ["--page", str(page)]
        if static:
            argv.append("--static")
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        line = self.popen.stdout.readline()
        if not line:
            _stop(self.popen)
            raise RuntimeError("the fleet did not start")
        started = json.loads(line)
        self.ports, self.stats_port = started["ports"], started["stats_port"]
        self.pid = self.popen.pid

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def stats(self) -> dict:
        """The requests the fleet served so far: ``requests`` and ``paths`` ("GET /metrics": n)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.stats_port, timeout=10)
        try:
            connection.request("GET", "/_fleet/stats")
            return json.loads(connection.getresponse().read())
        finally:
            connection.close()

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


LOOPS = ("asyncio", "uvloop", "evloop")


def has_evloop(ref: str | None) -> bool:
    """Does this tree's (or commit ``ref``'s) exporter run on its own ``evloop``? Before issue 34
    it did; since, its loop is asyncio's or uvloop's, chosen by ``HANGWATCH_LOOP``."""
    if ref is None:
        return (ROOT / "exporter" / "evloop.py").is_file()
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}:exporter/evloop.py"],
                           stderr=subprocess.DEVNULL)
    return found.returncode == 0


def loop_command(loop: str, evloop_tree: bool) -> tuple[list[str], dict]:
    """How to start an exporter on ``loop``: (argv before ``exporter``, extra environment).

    An evloop tree runs as it is (``evloop``) or through ``bench/loopchoice.py`` (``uvloop``);
    a newer tree is told its loop by ``HANGWATCH_LOOP`` (``asyncio`` or ``uvloop``)."""
    if loop not in LOOPS:
        raise ValueError(f"{loop!r}: a loop is one of {', '.join(LOOPS)}")
    if evloop_tree:
        if loop == "evloop":
            return [sys.executable, "-m", "hangwatch"], {}
        if loop == "uvloop":
            return [sys.executable, str(ROOT / "bench" / "loopchoice.py")], {"HANGWATCH_BENCH_LOOP": loop}
        raise ValueError("this exporter runs on evloop: its loops are evloop and uvloop")
    if loop == "evloop":
        raise ValueError("this exporter has no evloop (issue 34): its loops are asyncio and uvloop")
    return [sys.executable, "-m", "hangwatch"], {"HANGWATCH_LOOP": loop}


class Exporter:
    """``hangwatch exporter`` on a free loopback port; ``ref`` runs an older commit's code;
    ``loop`` picks its event loop (``loop_command``)."""

    def __init__(self, workdir: Path, config: str = "", ref: str | None = None, listen: str = "127.0.0.1:0",
                 loop: str | None = None):
        evloop_tree = has_evloop(ref)
        loop = loop or ("evloop" if evloop_tree else "uvloop")
        command, extra = loop_command(loop, evloop_tree)
        env = dict(os.environ)
        env.pop("HANGWATCH_LOOP", None)
        env.update(extra)
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
BLACKBOX_MODULE = "vllm_metrics"          # the busy fleet: GET /metrics
BLACKBOX_COMPLETION = "vllm_completion"   # the idle fleet: the naive probe, one 1-token completion


def completion_body() -> str:
    """The 1-token completion hangwatch sends at idle (``hangwatch.probe``), for the captured model."""
    model = json.loads((ROOT / "tests" / "data" / "vllm-0.32" / "models.json").read_text())["data"][0]["id"]
    return json.dumps({"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0})


def blackbox_config() -> str:
    """Two http modules. ``vllm_metrics`` reads a backend's ``/metrics``: ``GET``, 200 wanted,
    identity encoding as hangwatch asks; it reads the body whole (to count its bytes) and looks
    at nothing in it: the cheapest honest reading, so the ratio is the strict one.
    ``vllm_completion`` is the naive liveness probe hangwatch is compared to at idle: ``POST`` the
    same 1-token completion to ``/v1/completions``, 200 wanted."""
    return (
        "modules:\n"
        f"  {BLACKBOX_MODULE}:\n"
        "    prober: http\n"
        "    timeout: 10s\n"
        "    http:\n"
        "      method: GET\n"
        "      valid_status_codes: [200]\n"
        "      preferred_ip_protocol: ip4\n"
        "      headers:\n"
        "        Accept-Encoding: identity\n"
        f"  {BLACKBOX_COMPLETION}:\n"
        "    prober: http\n"
        "    timeout: 10s\n"
        "    http:\n"
        "      method: POST\n"
        "      valid_status_codes: [200]\n"
        "      preferred_ip_protocol: ip4\n"
        "      headers:\n"
        "        Content-Type: application/json\n"
        f"      body: '{completion_body()}'\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Blackbox:
    """blackbox_exporter (the reference multi-target exporter, Go) on a loopback port, with the
    modules of ``blackbox_config``. Probe ``/probe?target=http://host:port/metrics&module=vllm_metrics``
    or ``/probe?target=http://host:port/v1/completions&module=vllm_completion``."""

    def __init__(self, workdir: Path, binary: str | None = None):
        binary = binary or shutil.which(BLACKBOX) or shutil.which("blackbox_exporter")
        if binary is None:
            raise RuntimeError(f"{BLACKBOX} is not installed (Debian: apt-get install -y {BLACKBOX})")
        config = workdir / "blackbox.yml"
        config.write_text(blackbox_config())
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
