"""TLS material for tests, made with openssl: a CA, a server certificate for 127.0.0.1 (what a
second dockerd serves with ``--tlsverify``) and a client certificate (what the webhook presents).
A second, unrelated CA makes "signed by someone else" cases."""
from __future__ import annotations

import pathlib
import subprocess
from dataclasses import dataclass

from tests.support.require import require_binary

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certs:
    ca: pathlib.Path
    server_cert: pathlib.Path
    server_key: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path
    other_ca: pathlib.Path         # a CA that signed nothing here
    other_client_cert: pathlib.Path  # signed by other_ca
    other_client_key: pathlib.Path

    def tls(self) -> dict:
        """The webhook config's ``tls`` block for a Docker host served with these certificates."""
        return {"ca_file": str(self.ca), "cert_file": str(self.client_cert), "key_file": str(self.client_key)}


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def _ca(directory: pathlib.Path, name: str) -> None:
    _openssl("req", "-x509", *EC, "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN=hangwatch test {name}", cwd=directory)


def _signed(directory: pathlib.Path, ca: str, name: str, subject: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", *EC, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


def make_certs(directory: pathlib.Path) -> Certs:
    require_binary("openssl")
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _signed(directory, "ca", "server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _signed(directory, "ca", "client", "/CN=hangwatch-webhook", "extendedKeyUsage=clientAuth\n")
    _signed(directory, "other-ca", "other-client", "/CN=someone-else", "extendedKeyUsage=clientAuth\n")
    for key in directory.glob("*-key.pem"):
        key.chmod(0o600)
    return Certs(ca=directory / "ca.pem", server_cert=directory / "server.pem",
                 server_key=directory / "server-key.pem", client_cert=directory / "client.pem",
                 client_key=directory / "client-key.pem", other_ca=directory / "other-ca.pem",
                 other_client_cert=directory / "other-client.pem", other_client_key=directory / "other-client-key.pem")
