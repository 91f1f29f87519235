"""A CA and certificates made for a test, with the ``openssl`` command line.

Every certificate names 127.0.0.1 and localhost (what loopback peers and
clients dial) and is good for server and client auth: nats-server's routes
are mutual TLS, each member both dialling and accepting with its one cert.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

DAYS = "2"
CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
EXTENSIONS = ("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
              "extendedKeyUsage=serverAuth,clientAuth\n"
              "basicConstraints=critical,CA:FALSE\n"
              "keyUsage=critical,digitalSignature\n")


def openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("the openssl command line is not installed")
    return found


def _run(*args: str) -> None:
    subprocess.run([openssl(), *args], check=True, capture_output=True, timeout=60)


def make_ca(dir: str, name: str = "ca") -> tuple[str, str]:
    """A self-signed CA in *dir*: (cert path, key path)."""
    os.makedirs(dir, exist_ok=True)
    cert, key = os.path.join(dir, f"{name}.pem"), os.path.join(dir, f"{name}.key")
    _run("req", "-x509", *CURVE, "-keyout", key, "-out", cert, "-days", DAYS, "-subj", f"/CN=crewlet test {name}",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    os.chmod(key, 0o600)
    return cert, key


def make_cert(dir: str, name: str, ca: tuple[str, str]) -> tuple[str, str]:
    """A certificate for *name* signed by *ca*: (cert path, key path, 0600)."""
    cert, key = os.path.join(dir, f"{name}.pem"), os.path.join(dir, f"{name}.key")
    csr, ext = os.path.join(dir, f"{name}.csr"), os.path.join(dir, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(EXTENSIONS)
    _run("req", *CURVE, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _run("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
         "-days", DAYS, "-extfile", ext)
    os.chmod(key, 0o600)
    return cert, key
