"""A second, real Docker host on this machine, reached the way a remote one is: over TCP
with TLS client certificates (``dockerd --tlsverify``), certificates made with openssl.

It has its own ``--data-root``, ``--exec-root`` and ``--pidfile`` (a short directory under
/tmp: containerd's socket path must stay under 108 bytes), no bridge and no firewall rules
(REAL-PARTS.md), and listens on ``127.0.0.1:0``: the port it got is read back from its log.
The test image is imported into it (there is no registry). ``freeze`` (SIGSTOP: the port
still accepts connections, nothing answers), ``thaw`` and ``stop`` play a host in trouble.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import docker

from hangwatch.demo.processes import stop_popen
from tests.support import stopped
from tests.support.require import require, require_binary

from .certs import Certs
from .real_parts import IMAGE, image_tar

START_DEADLINE = 60.0
_LISTEN = re.compile(r'API listen on 127\.0\.0\.1:(\d+)')


class SecondDockerHost:
    def __init__(self, certs: Certs):
        require_binary("dockerd")
        require(os.geteuid() == 0, "root, to run a second dockerd")
        self.certs = certs
        self.root = tempfile.mkdtemp(prefix="hw-dockerd-", dir="/tmp")
        self.log_path = os.path.join(self.root, "dockerd.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
             "--data-root", os.path.join(self.root, "data"), "--exec-root", os.path.join(self.root, "exec"),
             "--pidfile", os.path.join(self.root, "dockerd.pid"), "-H", "tcp://127.0.0.1:0",
             "--tlsverify", "--tlscacert", str(certs.ca), "--tlscert", str(certs.server_cert),
             "--tlskey", str(certs.server_key)],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.client = None
        try:
            self.port = self._wait_for_port()
            self.url = f"tcp://127.0.0.1:{self.port}"
            self.client = self.connect(certs.client_cert, certs.client_key)
            self.client.api.import_image_from_data(image_tar(), repository=IMAGE.split(":")[0], tag="latest")
        except BaseException:
            self.close()
            raise

    def connect(self, cert, key, timeout: float = 30):
        """A DockerClient for the tests' own use (requests' CA-bundle variables ignored, as the webhook does)."""
        tls = docker.tls.TLSConfig(client_cert=(str(cert), str(key)), ca_cert=str(self.certs.ca), verify=True)
        asking = docker.DockerClient(base_url=self.url, tls=tls, timeout=timeout,
                                     version=docker.constants.MINIMUM_DOCKER_API_VERSION)
        asking.api.trust_env = False
        version = asking.api.version(api_version=False)["ApiVersion"]
        asking.close()
        client = docker.DockerClient(base_url=self.url, tls=tls, timeout=timeout, version=version)
        client.api.trust_env = False
        return client

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the second dockerd exited ({self.process.returncode}):\n{self.log()[-3000:]}")
            found = _LISTEN.search(self.log())
            if found:
                return int(found.group(1))
            time.sleep(0.1)
        raise AssertionError(f"the second dockerd did not listen within {START_DEADLINE:g}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        with open(self.log_path, "rb") as handle:
            return handle.read().decode(errors="replace")

    def freeze(self) -> None:
        """SIGSTOP; returns once every dockerd thread has stopped (a call sent at once could
        otherwise still be answered, and the test's first 503 would be a 200)."""
        stopped.stop(self.process.pid, "the second dockerd")

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        stop_popen(self.process, 30)

    def close(self) -> None:
        if self.client is not None and self.process.poll() is None:
            try:
                for container in self.client.containers.list(all=True):
                    container.remove(force=True)
            except Exception:
                pass
            self.client.close()
        self.stop()
        self._log.close()
        netns = os.path.join(self.root, "exec", "netns", "default")  # dockerd leaves this bind mount
        if os.path.ismount(netns):
            subprocess.run(["umount", netns], capture_output=True, timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
