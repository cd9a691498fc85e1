"""Optional TLS on the API and interserver ports (a PEM certificate chain and key from the config)."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext | None:
    """A server context (TLS 1.2 or newer) when both files are configured, else None (plain HTTP).
    Reads the files: call it off the event loop."""
    if cert_file is None or key_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """The context peers' HTTPS interserver answers are checked with: the system's CAs, or ``ca_file``."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file) if ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
