"""What a table replica needs of the DataPartsExchange transport: the engine's side of that seam.

A replica serves its parts through the :class:`PartsExchange` it is given (``ReplicaEnv.interserver``) and
publishes the exchange's ``port`` and ``scheme`` in ``replicas/<r>/host``.  The HTTP server that speaks the
protocol (``replicad.server.interserver``) is adapted to it by ``replicad.server.parts_exchange``, so the
engine never imports the transport (ClickHouse's ``DataPartsExchange::Service`` is registered with the
``InterserverIOHandler`` in the same direction).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from ssl import SSLContext
from typing import Protocol

from replicad.storage.checksums import Checksums
from replicad.storage.fresh_files import PartFiles


@dataclass(frozen=True)
class ServedPart:
    """An active part a peer may download: its directory and its ``checksums.txt``."""

    path: Path
    checksums: Checksums
    #: every file of the part held in memory (a part written here lately: replicad.storage.fresh_files)
    files: PartFiles = ()


#: part name -> the part (or None when this replica does not have it)
ServedPartLookup = Callable[[str], ServedPart | None]
#: S3 zero-copy: part name -> (unique id, metadata texts) of a committed part on a zero-copy disk, or None
ZeroCopyLookup = Callable[[str], Awaitable[tuple[str, dict[str, bytes]] | None]]


class PartsExchange(Protocol):
    """The DataPartsExchange endpoint registry of this process."""

    @property
    def port(self) -> int: ...

    @property
    def scheme(self) -> str: ...

    def serve(
        self, replica_zk_path: str, lookup: ServedPartLookup, on_broken_part: Callable[[str], None],
        zero_copy: ZeroCopyLookup | None = None,
    ) -> None:
        """Answer peers' fetches for ``replica_zk_path`` from ``lookup``; ``on_broken_part(name)`` when a
        part fails while it is sent; ``zero_copy``: the metadata of parts peers may get zero-copy."""
        ...

    def withdraw(self, replica_zk_path: str) -> None:
        """Stop answering for ``replica_zk_path``."""
        ...


@dataclass(frozen=True)
class FetchCredentials:
    user: str | None = None
    password: str | None = None
    #: how peers' HTTPS answers are checked (True: the system's CAs, :func:`system_tls_context`; a context
    #: from interserver.tls_ca_file)
    ssl: ssl.SSLContext | bool = True

    async def ssl_for(self, url: str) -> SSLContext | bool:
        """The ``ssl`` argument of the request to ``url``: always a context of ours for HTTPS."""
        if self.ssl is not True or not url.startswith("https:"):
            return self.ssl
        if system_tls_context.cache_info().currsize:
            return system_tls_context()
        return await asyncio.to_thread(system_tls_context)  # the CA bundle read once, off the event loop

    def headers(self) -> dict[str, str]:
        """``Authorization: Basic …`` when a user is configured (what 18.16 sends: its own credentials)."""
        if not self.user:
            return {}
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}


@functools.cache
def system_tls_context() -> ssl.SSLContext:
    """Peers' HTTPS answers checked with the system's CAs, as aiohttp's default context does (a TLS client
    context with the default CA locations, ALPN ``http/1.1``).  Made by the first HTTPS fetch needing it (it
    reads and parses the CA bundle: call it off the event loop), not by aiohttp when imported: the daemon
    leaves aiohttp's own defaults without CAs (``replicad.memory.import_without_default_tls``)."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(("http/1.1",))
    return ctx
