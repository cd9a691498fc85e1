"""Where a replica can be reached: ``replicas/<r>/host`` and ``replicas/<r>/is_active``.

``host`` (ReplicatedMergeTreeAddress)::

    host: <escaped>\\nport: <interserver port>\\ntcp_port: <native port>\\ndatabase: <escaped>\\n
    table: <escaped>\\nscheme: <escaped>\\n

18.16 reads ``scheme`` as optional (default ``http``) and ignores anything after it; modern servers may add
``desired_part_metadata_format_version: N``.  Unknown ``key: value`` lines after ``scheme`` are kept.

``is_active`` (ephemeral): 18.16 writes ``pid: <pid>, random: <UInt64>``; modern servers write their server
UUID in another form, which is kept verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from replicad.model.text_io import TextReader, decode, encode, escape

_EXTRA_LINE_RE = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*: [^\n]*")
_IS_ACTIVE_RE = re.compile(r"pid: (\d+), random: (\d+)")


@dataclass(frozen=True)
class ReplicaAddress:
    host: str
    #: Interserver (DataPartsExchange) port.
    replication_port: int
    #: Native protocol port (``tcp_port``); replicad has none and writes a placeholder the caller picks.
    queries_port: int
    database: str
    table: str
    scheme: str = "http"
    #: Modern ``desired_part_metadata_format_version``; 0 = not written (the 18.16 layout).
    desired_part_metadata_format_version: int = 0
    extra_lines: tuple[str, ...] = ()

    def to_text(self) -> str:
        out = (
            f"host: {escape(self.host)}\n"
            f"port: {self.replication_port}\n"
            f"tcp_port: {self.queries_port}\n"
            f"database: {escape(self.database)}\n"
            f"table: {escape(self.table)}\n"
            f"scheme: {escape(self.scheme)}\n"
        )
        if self.desired_part_metadata_format_version:
            out += f"desired_part_metadata_format_version: {self.desired_part_metadata_format_version}\n"
        return out + "".join(f"{line}\n" for line in self.extra_lines)

    def to_bytes(self) -> bytes:
        return encode(self.to_text())

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.replication_port}"

    @classmethod
    def parse(cls, text: bytes | str) -> ReplicaAddress:
        r = TextReader(text, "replica host")
        r.expect(b"host: ")
        host = r.escaped()
        r.expect(b"\nport: ")
        port = r.unsigned()
        r.expect(b"\ntcp_port: ")
        tcp_port = r.unsigned()
        r.expect(b"\ndatabase: ")
        database = r.escaped()
        r.expect(b"\ntable: ")
        table = r.escaped()
        r.expect(b"\n")
        scheme = "http"
        desired = 0
        extra: list[str] = []
        if r.check(b"scheme: "):
            scheme = r.escaped()
            r.expect(b"\n")
        while not r.eof():
            if r.check(b"desired_part_metadata_format_version: "):
                desired = r.unsigned()
            else:
                line = r.line()
                if not _EXTRA_LINE_RE.fullmatch(line):
                    raise r.error(f"unexpected line {line!r}")
                extra.append(decode(line))
            r.expect(b"\n")
        if not 0 < port < 65536:
            raise r.error(f"bad interserver port {port}")
        return cls(host, port, tcp_port, database, table, scheme, desired, tuple(extra))


@dataclass(frozen=True)
class ActiveMarker:
    """Content of ``replicas/<r>/is_active``: identifies the process that holds the replica."""

    text: str

    @classmethod
    def for_process(cls, pid: int, random: int) -> ActiveMarker:
        """The 18.16 form."""
        return cls(f"pid: {pid}, random: {random & 0xFFFFFFFFFFFFFFFF}")

    @classmethod
    def parse(cls, data: bytes | str) -> ActiveMarker:
        return cls(decode(data) if isinstance(data, bytes) else data)

    @property
    def pid(self) -> int | None:
        m = _IS_ACTIVE_RE.fullmatch(self.text)
        return int(m.group(1)) if m else None

    @property
    def random(self) -> int | None:
        m = _IS_ACTIVE_RE.fullmatch(self.text)
        return int(m.group(2)) if m else None

    def to_text(self) -> str:
        return self.text

    def to_bytes(self) -> bytes:
        return encode(self.text)
