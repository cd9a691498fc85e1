"""Mutation records: the text of ``<zk>/mutations/NNNNNNNNNN``.

18.16 writes (and, with ``assertEOF``, only reads)::

    format version: 1\\n
    create time: <YYYY-MM-DD hh:mm:ss, server time zone>\\n
    source replica: <name>\\n
    block numbers count: <N>\\n
    <partition_id>\\t<block number>\\n          (N lines, partition ids in byte order)
    commands: <escaped one-line command list>    (no final LF)

The command list is ClickHouse's one-line AST text: every command is followed by ``,`` (except the last)
and a space, hence the trailing space (``DELETE WHERE x = 2 ``).  Modern servers append
``\\nalter version: <int>`` (``-1`` when the mutation is not part of an ALTER), which 18.16 cannot read:
``alter_version=None`` keeps the 18.16 layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from replicad.errors import ZnodeFormatError
from replicad.model.text_io import TextReader, check_raw, encode, escape, format_datetime


def format_commands(commands: Iterable[str]) -> str:
    """Join one-line command texts the way ClickHouse formats an ``ASTAlterCommandList``."""
    items = list(commands)
    if not items:
        raise ZnodeFormatError("a mutation needs at least one command")
    return "".join(cmd + ("," if i + 1 < len(items) else "") + " " for i, cmd in enumerate(items))


@dataclass(frozen=True)
class MutationEntry:
    source_replica: str
    #: (partition_id, block number) pairs: the mutation applies to parts with data version < number.
    block_numbers: tuple[tuple[str, int], ...]
    #: Unescaped one-line command list, as produced by ``format_commands`` (with its trailing space).
    commands: str
    create_time: int = 0
    #: ``None`` = 18.16 layout (no ``alter version:`` line); modern servers write -1 or the ALTER version.
    alter_version: int | None = None
    znode_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted((str(p), int(n)) for p, n in self.block_numbers))
        if len({p for p, _ in ordered}) != len(ordered):
            raise ZnodeFormatError(f"duplicate partition in mutation block numbers {self.block_numbers!r}")
        object.__setattr__(self, "block_numbers", ordered)

    @classmethod
    def create(
        cls,
        *,
        source_replica: str,
        block_numbers: Mapping[str, int],
        commands: Iterable[str],
        create_time: int = 0,
    ) -> MutationEntry:
        return cls(source_replica, tuple(block_numbers.items()), format_commands(commands), create_time)

    @property
    def block_numbers_map(self) -> dict[str, int]:
        return dict(self.block_numbers)

    @property
    def version(self) -> int:
        """The mutation's number: its znode suffix (``0000000003`` → 3)."""
        digits = self.znode_name.rsplit("-", 1)[-1]
        if not digits.isdigit():
            raise ZnodeFormatError(f"mutation znode name {self.znode_name!r} has no sequence number")
        return int(digits)

    def block_number_for(self, partition_id: str) -> int | None:
        return self.block_numbers_map.get(partition_id)

    def to_text(self, tz: str = "UTC") -> str:
        out = [
            "format version: 1\n",
            f"create time: {format_datetime(self.create_time, tz)}\n",
            f"source replica: {check_raw(self.source_replica, 'source replica')}\n",
            f"block numbers count: {len(self.block_numbers)}\n",
        ]
        out.extend(f"{check_raw(p, 'partition id')}\t{n}\n" for p, n in self.block_numbers)
        out.append(f"commands: {escape(self.commands)}")
        if self.alter_version is not None:
            out.append(f"\nalter version: {self.alter_version}")
        return "".join(out)

    def to_bytes(self, tz: str = "UTC") -> bytes:
        return encode(self.to_text(tz))

    @classmethod
    def parse(cls, text: bytes | str, *, tz: str = "UTC", znode_name: str = "") -> MutationEntry:
        r = TextReader(text, f"mutation entry {znode_name}".rstrip())
        r.expect(b"format version: 1\n")
        r.expect(b"create time: ")
        create_time = r.datetime(tz)
        r.expect(b"\nsource replica: ")
        source_replica = r.raw()
        r.expect(b"\nblock numbers count: ")
        numbers = r.counted_pairs(r.raw, r.integer)
        r.expect(b"commands: ")
        commands = r.escaped()
        if not commands.strip():
            raise r.error("empty command list")
        alter_version = None
        if r.check(b"\nalter version: "):
            alter_version = r.integer()
        r.expect_eof()
        return cls(source_replica, tuple(numbers), commands, create_time, alter_version, znode_name)
