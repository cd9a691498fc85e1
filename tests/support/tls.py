"""A self-signed certificate for 127.0.0.1/localhost, made for a test with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files in ``directory``; the certificate is its own CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not available")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key
