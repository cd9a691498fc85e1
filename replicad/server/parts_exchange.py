"""The interserver HTTP server as the engine's :class:`replicad.replication.exchange.PartsExchange`."""

from __future__ import annotations

from collections.abc import Callable

from replicad.replication.exchange import ServedPartLookup, ZeroCopyLookup
from replicad.server.interserver import Endpoint, InterserverServer, PartToSend


class InterserverExchange:
    """Registers table replicas' parts with an :class:`InterserverServer` (which the owner starts and
    stops)."""

    def __init__(self, server: InterserverServer) -> None:
        self.server = server

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def scheme(self) -> str:
        return self.server.scheme

    def serve(
        self, replica_zk_path: str, lookup: ServedPartLookup, on_broken_part: Callable[[str], None],
        zero_copy: ZeroCopyLookup | None = None,
    ) -> None:
        def part_to_send(name: str) -> PartToSend | None:
            part = lookup(name)
            return None if part is None else PartToSend(part.path, part.checksums, part.files)

        self.server.register(replica_zk_path, Endpoint(lookup=part_to_send, on_broken_part=on_broken_part,
                                                       zero_copy=zero_copy))

    def withdraw(self, replica_zk_path: str) -> None:
        self.server.unregister(replica_zk_path)
