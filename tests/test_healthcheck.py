"""The image's HEALTHCHECK (deploy/healthcheck.py) against real exporter and webhook processes.

It finds the server from a process's command line, asks that server about itself and never a
backend: a wedged exporter (SIGSTOP) is unhealthy within the check's timeout, while an
exporter whose every probe worker waits on a stalled backend is healthy (its /metrics answers
on the event loop) — a stalled vLLM must not make the exporter's container look broken.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.support.hostile import HostileServer
from tests.support.servers import REPO, ServerProcess, free_port, webhook_config

SCRIPT = REPO / "deploy" / "healthcheck.py"
spec = importlib.util.spec_from_file_location("healthcheck", SCRIPT)
healthcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(healthcheck)


@pytest.mark.parametrize("argv, url", [
    (["/opt/hangwatch/bin/python", "/opt/hangwatch/bin/hangwatch", "exporter", "--listen", "0.0.0.0:9877",
      "--config", "/etc/hangwatch/exporter.yml"], "http://127.0.0.1:9877/metrics"),
    (["/sbin/docker-init", "--", "hangwatch", "webhook", "--config", "/etc/w.yml", "--listen", "0.0.0.0:9878"],
     "http://127.0.0.1:9878/healthz"),
    (["python", "-m", "hangwatch", "exporter"], "http://127.0.0.1:9877/metrics"),
    (["hangwatch", "webhook", "--config", "w.yml"], "http://127.0.0.1:9878/healthz"),
    (["hangwatch", "exporter", "--listen=[::]:9100"], "http://[::1]:9100/metrics"),
    (["hangwatch", "exporter", "--listen", "10.1.2.3:9877"], "http://10.1.2.3:9877/metrics"),
    (["hangwatch", "check", "http://vllm:8000"], None),
    (["hangwatch", "simulate", "--listen", "127.0.0.1:8001"], None),
    (["hangwatch", "--help"], None),
    (["/usr/bin/prometheus", "--config.file=x"], None),
])
def test_the_url_comes_from_the_command_line(argv, url):
    assert healthcheck.health_url(argv) == url


def run_check(pid: int) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), "--pid", str(pid)], capture_output=True, text=True,
                          timeout=30)
    return done.returncode, done.stdout.strip(), time.monotonic() - started


def test_a_running_exporter_is_healthy_and_a_wedged_one_is_not():
    with ServerProcess("exporter", port=free_port()) as exporter:
        code, out, _ = run_check(exporter.process.pid)
        assert (code, out) == (0, f"healthy: {exporter.url}/metrics: 200")
        os.kill(exporter.process.pid, signal.SIGSTOP)
        try:
            code, out, seconds = run_check(exporter.process.pid)
        finally:
            os.kill(exporter.process.pid, signal.SIGCONT)
        assert code == 1 and out.startswith("unhealthy:"), out
        assert seconds < healthcheck.TIMEOUT + 2, "within the image's HEALTHCHECK --timeout (5s)"
        exporter.stop()
        code, out, _ = run_check(exporter.process.pid)
        assert code == 1, "a process that is gone is no healthy server"


def test_an_exporter_busy_with_a_stalled_backend_is_still_healthy(tmp_path):
    stalled = HostileServer({"/metrics": "drip_headers"}, gap=30)
    config = tmp_path / "exporter.yml"
    config.write_text("timeout: 10s\nmax_concurrent_probes: 1\n")
    try:
        with ServerProcess("exporter", "--config", str(config), port=free_port()) as exporter:
            threading.Thread(target=_quietly, args=(f"{exporter.url}/probe?target={stalled.url}",),
                             daemon=True).start()
            deadline = time.monotonic() + 10
            while ("GET", "/metrics") not in stalled.requests:
                assert time.monotonic() < deadline, "the probe never reached the stalled backend"
                time.sleep(0.02)
            # Every worker is taken: another probe is shed, and the health check still passes.
            assert requests.get(f"{exporter.url}/probe?target={stalled.url}", timeout=15).status_code == 503
            code, out, _ = run_check(exporter.process.pid)
            assert code == 0, out
    finally:
        stalled.stop()


def test_a_running_webhook_is_healthy(tmp_path):
    with ServerProcess("webhook", "--config", str(webhook_config(tmp_path)), port=free_port()) as webhook:
        code, out, _ = run_check(webhook.process.pid)
    assert (code, out) == (0, f"healthy: {webhook.url}/healthz: 200")


def test_another_command_needs_nothing():
    other = subprocess.Popen(["sleep", "30"])  # e.g. `docker run IMAGE check URL`: nothing serves
    try:
        code, out, _ = run_check(other.pid)
    finally:
        other.kill()
        other.wait()
    assert (code, out) == (0, "healthy: no hangwatch server runs here")


def _quietly(url: str) -> None:
    try:
        requests.get(url, timeout=30)
    except requests.RequestException:
        pass
