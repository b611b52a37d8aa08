"""A real OpenSSH server on 127.0.0.1 for the webhook's ``ssh://`` Docker host, as a GPU box
reached over SSH would be: the Docker SDK's SSH transport (paramiko) logs in with a key and
runs ``docker system dial-stdio`` there, which speaks to that box's Docker.

Everything is in one temporary directory: the host key, the server config, the client's
HOME (its key and a ``known_hosts`` holding the server's key: the SDK refuses unknown host
keys). The key may do nothing but dial Docker (``restrict,command="docker system
dial-stdio"`` in ``authorized_keys``), which is how a fleet should hand out such a key.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

from hangwatch.demo.processes import listening_ports, stop_popen
from hangwatch.demo.wait import WaitTimeout, wait_until
from harness.ports import address_in_use, free_port
from tests.support.require import require, require_binary

START_DEADLINE = 20.0


class SSHServer:
    def __init__(self):
        sshd = require_binary("sshd")
        keygen = require_binary("ssh-keygen")
        require(os.geteuid() == 0, "root, to run sshd")
        from hangwatch.webhook.hosts import ssh_transport_missing
        require(ssh_transport_missing() is None, "paramiko, the Docker SDK's SSH transport (pip install 'docker[ssh]')")
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="hw-sshd-", dir="/tmp"))
        self.home = self.root / "home"
        (self.home / ".ssh").mkdir(parents=True, mode=0o700)
        for key in (self.root / "host_key", self.home / ".ssh" / "id_ed25519"):
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
        client_key = (self.home / ".ssh" / "id_ed25519.pub").read_text().strip()
        authorized = self.root / "authorized_keys"
        authorized.write_text(f'restrict,command="docker system dial-stdio" {client_key}\n')
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        self.log_path = self.root / "sshd.log"
        self._log = open(self.log_path, "wb")
        # sshd must be told its port: a port free a moment ago may be taken before it binds it
        # (it then says so and exits), so it starts again on another.
        for attempt in range(1, 6):
            self._start(sshd, authorized)
            if self._wait_listening():
                break
            if attempt == 5 or not address_in_use(self.log()):
                self.close()
                raise AssertionError(f"sshd did not start:\n{self.log()[-2000:]}")
        self.url = f"ssh://root@127.0.0.1:{self.port}"
        self._keygen = keygen

    def _start(self, sshd: str, authorized: pathlib.Path) -> None:
        self.port = free_port()
        host_key = (self.root / "host_key.pub").read_text().split()
        (self.home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        config = self.root / "sshd_config"
        config.write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {self.port}", f"HostKey {self.root / 'host_key'}",
            f"PidFile {self.root / 'sshd.pid'}", f"AuthorizedKeysFile {authorized}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "LogLevel VERBOSE", ""]))
        self._log.seek(0)
        self._log.truncate()  # this attempt's log only: the bind failure read is this one's
        self.process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=self._log,
                                        stderr=subprocess.STDOUT)

    def _wait_listening(self) -> bool:
        """True once this sshd says it listens on its port (and holds it); False if it exited."""
        def said():
            if self.process.poll() is not None:
                return "exited"
            if f"Server listening on 127.0.0.1 port {self.port}" in self.log() \
                    and self.port in listening_ports(self.process.pid):
                return "listening"
            return None
        try:
            return wait_until(said, START_DEADLINE, f"sshd to listen on {self.port}", interval=0.05) == "listening"
        except WaitTimeout:
            self.close()
            raise AssertionError(f"sshd did not start:\n{self.log()[-2000:]}") from None

    def impostor_home(self) -> pathlib.Path:
        """A HOME with the same client key whose known_hosts holds another key for this server
        (what a man in the middle, or a reinstalled box, looks like)."""
        home = self.root / "impostor-home"
        shutil.copytree(self.home, home)
        subprocess.run([self._keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "other_key")],
                       check=True, timeout=30)
        other = (self.root / "other_key.pub").read_text().split()
        (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {other[0]} {other[1]}\n")
        return home

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_popen(self.process, 10)

    def close(self) -> None:
        self.stop()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)
