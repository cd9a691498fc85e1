"""Replication log entries: the text of ``log/log-NNNNNNNNNN`` and ``replicas/<r>/queue/queue-NNNNNNNNNN``.

``LogEntry.parse`` reads every format ClickHouse has written (format versions 1–7: 18.16 and modern servers,
including ``part_type:``/``storage_type:`` lines, ``log_entry_id:``, multi-id ``block_id:``, the modern
MERGE_PARTS / MUTATE_PART optional lines and the entry types 18.16 does not know).  ``LogEntry.to_text``
prints like ClickHouse's ``writeText``: an entry that only uses what 18.16 knows comes out as format 4,
byte-identical to 18.16's own output; modern-only fields are printed the way modern servers print them (and
``readable_by_18_16`` is then False).

Each entry type owns its body (ClickHouse's per-type ``readText``/``writeText``): ``_BODY_READERS`` maps the
keyword line to its reader and ``_BODY_WRITERS`` maps the type to its writer; the header and the tail lines
are common to all.

``create_time`` is unix seconds; the text holds it as local time of the server time zone, so parse and print
take the time zone (default UTC).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from replicad.errors import ZnodeFormatError
from replicad.model.replace_range import ReplaceRangeEntry
from replicad.model.text_io import TextReader, check_raw, decode, encode, escape, format_datetime, quote

#: Levels that mark a "fake" part covering a block range (DROP/DETACH PARTITION, REPLACE PARTITION).
MAX_LEVEL = 999_999_999
LEGACY_MAX_LEVEL = 4_294_967_295
FAKE_DROP_LEVELS = frozenset((MAX_LEVEL, LEGACY_MAX_LEVEL))

MERGE_TYPE_REGULAR = 1
_LAST_FORMAT_VERSION = 7
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_EXTRA_LINE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*: [^\n]*")


class LogEntryType(StrEnum):
    """ClickHouse's ``ReplicatedMergeTreeLogEntryData::Type`` names (as shown in system.replication_queue)."""

    GET_PART = "GET_PART"
    ATTACH_PART = "ATTACH_PART"
    MERGE_PARTS = "MERGE_PARTS"
    DROP_RANGE = "DROP_RANGE"
    DROP_PART = "DROP_PART"
    CLEAR_COLUMN = "CLEAR_COLUMN"
    CLEAR_INDEX = "CLEAR_INDEX"
    REPLACE_RANGE = "REPLACE_RANGE"
    MUTATE_PART = "MUTATE_PART"
    ALTER_METADATA = "ALTER_METADATA"
    SYNC_PINNED_PART_UUIDS = "SYNC_PINNED_PART_UUIDS"
    CLONE_PART_FROM_SHARD = "CLONE_PART_FROM_SHARD"


#: The types an 18.16 server can parse.
TYPES_18_16 = frozenset(
    (
        LogEntryType.GET_PART,
        LogEntryType.MERGE_PARTS,
        LogEntryType.DROP_RANGE,
        LogEntryType.DROP_PART,  # written as a plain "drop"; 18.16 treats it as a range drop of that part
        LogEntryType.CLEAR_COLUMN,
        LogEntryType.REPLACE_RANGE,
        LogEntryType.MUTATE_PART,
    )
)


def part_level(name: str, data_format_version: int = 1) -> int:
    """The level field of a part name (``<pid>_<min>_<max>_<level>[_<mutation>]``; format 0 has two dates)."""
    fields = name.split("_")
    idx = 3 if data_format_version >= 1 else 4
    if len(fields) not in (idx + 1, idx + 2) or not fields[idx].isdigit():
        raise ZnodeFormatError(f"Unexpected part name: {name!r}")
    return int(fields[idx])


def is_fake_drop_range_name(name: str, data_format_version: int = 1) -> bool:
    """NEW's ``isFakeDropRangePart``: the level is 999999999 or 4294967295."""
    return part_level(name, data_format_version) in FAKE_DROP_LEVELS


@dataclass(frozen=True)
class LogEntry:
    """One replication log / queue entry.  Fields not used by a type keep their defaults."""

    type: LogEntryType
    #: Resulting part (GET/ATTACH/MERGE/MUTATE/CLONE) or the covered range (DROP_RANGE, CLEAR_COLUMN/INDEX).
    new_part_name: str = ""
    source_parts: tuple[str, ...] = ()
    #: Empty for entries a replica put into its own queue (cloneReplica, CLEAR_COLUMN in 18.16).
    source_replica: str = ""
    #: Unix seconds; 0 = unknown (format 1), then ``parse(ctime=…)`` supplies the znode's ctime.
    create_time: int = 0
    #: Deduplication id(s) as written: modern servers may join several ids with ``,`` (see ``block_ids``).
    block_id: str = ""
    log_entry_id: str = ""
    quorum: int = 0
    deduplicate: bool = False
    merge_type: int = MERGE_TYPE_REGULAR
    #: ``into_uuid`` (MERGE_PARTS) / ``to_uuid`` (MUTATE_PART); "" = nil.
    new_part_uuid: str = ""
    deduplicate_by_columns: tuple[str, ...] = ()
    cleanup: bool = False
    #: MERGE_PARTS ``apply_patches`` (lightweight updates, 25.x).
    patch_parts: tuple[str, ...] = ()
    detach: bool = False
    column_name: str = ""
    index_name: str = ""
    replace_range: ReplaceRangeEntry | None = None
    #: MUTATE_PART of an ALTER and ALTER_METADATA; -1 = none.
    alter_version: int = -1
    have_mutation: bool = False
    columns_str: str = ""
    metadata_str: str = ""
    #: ATTACH_PART: 32 upper-case hex digits of the part's total checksum.
    part_checksum: str = ""
    source_shard: str = ""
    part_type: str = "Wide"
    storage_type: str = "Full"
    #: Unknown ``key: value`` lines met after the body (kept so the entry can be printed again).
    extra_lines: tuple[str, ...] = ()
    #: Format version the text was read with (informational; ``to_text`` chooses its own).
    format_version: int = field(default=4, compare=False)
    #: ``log-NNNNNNNNNN`` / ``queue-NNNNNNNNNN``; not part of the text.
    znode_name: str = field(default="", compare=False)

    # -- constructors --------------------------------------------------------------------------------------
    @classmethod
    def get_part(
        cls, part: str, *, source_replica: str, block_id: str = "", create_time: int = 0, quorum: int = 0
    ) -> LogEntry:
        return cls(
            LogEntryType.GET_PART,
            new_part_name=part,
            source_replica=source_replica,
            block_id=block_id,
            create_time=create_time,
            quorum=quorum,
        )

    @classmethod
    def merge_parts(
        cls,
        sources: list[str] | tuple[str, ...],
        new_part: str,
        *,
        source_replica: str,
        create_time: int = 0,
        deduplicate: bool = False,
    ) -> LogEntry:
        return cls(
            LogEntryType.MERGE_PARTS,
            new_part_name=new_part,
            source_parts=tuple(sources),
            source_replica=source_replica,
            create_time=create_time,
            deduplicate=deduplicate,
        )

    @classmethod
    def mutate_part(
        cls, source: str, new_part: str, *, source_replica: str, create_time: int = 0
    ) -> LogEntry:
        return cls(
            LogEntryType.MUTATE_PART,
            new_part_name=new_part,
            source_parts=(source,),
            source_replica=source_replica,
            create_time=create_time,
        )

    @classmethod
    def drop_range(
        cls, range_name: str, *, source_replica: str, detach: bool = False, create_time: int = 0
    ) -> LogEntry:
        kind = LogEntryType.DROP_RANGE if is_fake_drop_range_name(range_name) else LogEntryType.DROP_PART
        return cls(
            kind,
            new_part_name=range_name,
            source_replica=source_replica,
            detach=detach,
            create_time=create_time,
        )

    @classmethod
    def clear_column(cls, column: str, range_name: str, *, create_time: int = 0) -> LogEntry:
        """18.16 writes CLEAR_COLUMN with an empty ``source replica:``."""
        return cls(
            LogEntryType.CLEAR_COLUMN, new_part_name=range_name, column_name=column, create_time=create_time
        )

    # -- derived facts ---------------------------------------------------------------------------------------
    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(self.block_id.split(",")) if self.block_id else ()

    @property
    def is_alter_mutation(self) -> bool:
        return self.type is LogEntryType.MUTATE_PART and self.alter_version != -1

    @property
    def drop_range_name(self) -> str | None:
        """The range whose parts disappear when the entry succeeds (DROP_RANGE/DROP_PART/REPLACE_RANGE)."""
        if self.type in (LogEntryType.DROP_RANGE, LogEntryType.DROP_PART):
            return self.new_part_name
        if self.type is LogEntryType.REPLACE_RANGE and self.replace_range is not None:
            return self.replace_range.drop_range_part_name
        return None

    def virtual_part_names(self) -> tuple[str, ...]:
        """Parts that exist once the entry is executed, plus ranges in which merges must not be assigned
        (``getVirtualPartNames``)."""
        t = self.type
        if t in (
            LogEntryType.ALTER_METADATA,
            LogEntryType.CLEAR_COLUMN,
            LogEntryType.CLEAR_INDEX,
            LogEntryType.SYNC_PINNED_PART_UUIDS,
            LogEntryType.CLONE_PART_FROM_SHARD,
        ):
            return ()
        if t is LogEntryType.REPLACE_RANGE:
            rr = self.replace_range
            assert rr is not None
            return (*rr.new_part_names, rr.drop_range_part_name)
        return (self.new_part_name,) if self.new_part_name else ()

    def blocking_part_names(self) -> tuple[str, ...]:
        """Ranges tagged as future parts while the entry executes (``getBlockingPartNames``)."""
        names = self.virtual_part_names()
        if self.type in (LogEntryType.CLEAR_COLUMN, LogEntryType.CLEAR_INDEX):
            names = (*names, self.new_part_name)
        return names

    @property
    def readable_by_18_16(self) -> bool:
        """Whether an 18.16 replica can parse ``to_text()`` of this entry."""
        return (
            self.type in TYPES_18_16
            and self.text_format_version() == 4
            and self.merge_type == MERGE_TYPE_REGULAR
            and not self.cleanup
            and not self.patch_parts
            and self.alter_version == -1
            and self.part_type in ("Wide", "", "Unknown")
            and self.storage_type in ("Full", "", "Unknown")
            and not self.extra_lines
            and (self.replace_range is None or self.replace_range.commands is None)
        )

    def text_format_version(self) -> int:
        version = 4
        if self.deduplicate_by_columns:
            version = max(version, 6)
        if self.new_part_uuid and self.new_part_uuid != _NIL_UUID:
            version = max(version, 5)
        if self.log_entry_id:
            version = max(version, 7)
        return version

    # -- text ----------------------------------------------------------------------------------------------
    def to_text(self, tz: str = "UTC") -> str:
        version = self.text_format_version()
        name = check_raw(self.new_part_name, "part name")
        out = [
            f"format version: {version}\n",
            f"create_time: {format_datetime(self.create_time, tz)}\n",
            f"source replica: {check_raw(self.source_replica, 'source replica')}\n",
            f"block_id: {escape(self.block_id)}\n",
        ]
        if version >= 7:
            out.append(f"log_entry_id: {escape(self.log_entry_id)}\n")
        write_body = _BODY_WRITERS.get(self.type)
        if write_body is None:  # pragma: no cover - every type has a writer
            raise ZnodeFormatError(f"Unknown log entry type {self.type!r}")
        out.append(write_body(self, name))
        out.append("\n")
        if self.part_type not in ("Wide", "", "Unknown"):
            out.append(f"part_type: {check_raw(self.part_type, 'part type')}\n")
        if self.storage_type not in ("Full", "", "Unknown"):
            out.append(f"storage_type: {check_raw(self.storage_type, 'storage type')}\n")
        out.extend(f"{check_raw(line, 'line')}\n" for line in self.extra_lines)
        if self.quorum:
            out.append(f"quorum: {self.quorum}\n")
        return "".join(out)

    def to_bytes(self, tz: str = "UTC") -> bytes:
        return encode(self.to_text(tz))

    @classmethod
    def parse(
        cls,
        text: bytes | str,
        *,
        tz: str = "UTC",
        znode_name: str = "",
        ctime: int = 0,
        data_format_version: int = 1,
    ) -> LogEntry:
        """Parse any format 1–7 entry.  ``ctime`` (znode ctime, seconds) stands in for a missing create_time;
        ``data_format_version`` is the table's part-name format (0 = old-syntax tables)."""
        r = TextReader(text, f"replication log entry {znode_name or ''}".rstrip())
        r.expect(b"format version: ")
        version = r.integer()
        if not 1 <= version <= _LAST_FORMAT_VERSION:
            raise r.error(f"unknown ReplicatedMergeTreeLogEntry format version {version}")
        r.expect(b"\n")
        f: dict[str, object] = {"format_version": version, "znode_name": znode_name}
        create_time = 0
        if version >= 2:
            r.expect(b"create_time: ")
            create_time = r.datetime(tz)
            r.expect(b"\n")
        f["create_time"] = create_time or ctime
        r.expect(b"source replica: ")
        f["source_replica"] = r.raw()
        r.expect(b"\n")
        if version >= 3:
            r.expect(b"block_id: ")
            f["block_id"] = r.escaped()
            r.expect(b"\n")
        if version >= 7:
            r.expect(b"log_entry_id: ")
            f["log_entry_id"] = r.escaped()
            r.expect(b"\n")
        keyword = r.raw()
        r.expect(b"\n")
        read_body = _BODY_READERS.get(keyword)
        if read_body is None:
            raise r.error(f"unknown log entry type {keyword!r}")
        trailing_newline_found = read_body(r, f, _Body(keyword, version, data_format_version))
        if not trailing_newline_found:
            r.expect(b"\n")
        _read_tail(r, f)
        return cls(**f)  # type: ignore[arg-type]

    def with_znode(self, znode_name: str) -> LogEntry:
        """This entry under another queue node name (a copy without ``dataclasses.replace``'s field-by-field
        constructor call: the class has no ``__post_init__`` and every field is an ``__init__`` one)."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__, znode_name=znode_name)
        return out


def _read_merge_options(r: TextReader, f: dict[str, object]) -> bool:
    """MERGE_PARTS optional lines after ``deduplicate:``; returns True (the body's final LF was consumed)."""
    while True:
        r.expect(b"\n")
        if r.check(b"merge_type: "):
            f["merge_type"] = r.unsigned()
        elif r.check(b"into_uuid: "):
            f["new_part_uuid"] = r.uuid()
        elif r.check(b"deduplicate_by_columns: "):
            cols = [r.quoted()]
            while r.check(b","):
                cols.append(r.quoted())
            f["deduplicate_by_columns"] = tuple(cols)
        elif r.check(b"cleanup: "):
            f["cleanup"] = r.boolean()
        elif r.check(b"apply_patches:"):
            r.expect(b" ")
            n = r.unsigned()
            r.expect(b"\n")
            patches: list[str] = []
            for i in range(n):
                patches.append(r.raw())
                if i + 1 != n:
                    r.expect(b"\n")
            f["patch_parts"] = tuple(patches)
        else:
            return True


def _read_tail(r: TextReader, f: dict[str, object]) -> None:
    """Lines after the body: ``part_type:``, ``storage_type:``, unknown ``key: value`` lines, ``quorum:``."""
    extra: list[str] = []
    while not r.eof():
        if r.check(b"part_type: "):
            f["part_type"] = r.raw()
        elif r.check(b"storage_type: "):
            f["storage_type"] = r.raw()
        elif r.check(b"quorum: "):
            f["quorum"] = r.unsigned()
            r.expect(b"\n")
            r.expect_eof()
            break
        else:
            line = decode(r.line())
            if not _EXTRA_LINE_RE.fullmatch(line):
                raise r.error(f"unexpected line {line!r} after the entry body")
            extra.append(line)
        r.expect(b"\n")
    if extra:
        f["extra_lines"] = tuple(extra)


# ---- the body of each entry type: its text after the header, as ClickHouse's writeText / readText ----------


def _uuid_set(e: LogEntry) -> bool:
    return bool(e.new_part_uuid) and e.new_part_uuid != _NIL_UUID


def _write_merge(e: LogEntry, name: str) -> str:
    out = ["merge\n"]
    out.extend(f"{check_raw(s, 'part name')}\n" for s in e.source_parts)
    out.append(f"into\n{name}\ndeduplicate: {int(e.deduplicate)}")
    if e.merge_type != MERGE_TYPE_REGULAR:
        out.append(f"\nmerge_type: {e.merge_type}")
    if _uuid_set(e):
        out.append(f"\ninto_uuid: {e.new_part_uuid}")
    if e.deduplicate_by_columns:
        out.append("\ndeduplicate_by_columns: " + ",".join(quote(c) for c in e.deduplicate_by_columns))
    if e.cleanup:
        out.append("\ncleanup: 1")
    if e.patch_parts:
        out.append(f"\napply_patches: {len(e.patch_parts)}")
        out.extend(f"\n{check_raw(p, 'part name')}" for p in e.patch_parts)
    return "".join(out)


def _write_replace_range(e: LogEntry, name: str) -> str:
    if e.replace_range is None:
        raise ZnodeFormatError("REPLACE_RANGE entry without its range description")
    return "REPLACE_RANGE\n" + e.replace_range.to_text()


def _write_mutate(e: LogEntry, name: str) -> str:
    if len(e.source_parts) != 1:
        raise ZnodeFormatError(f"MUTATE_PART needs exactly one source part, got {e.source_parts!r}")
    out = f"mutate\n{check_raw(e.source_parts[0], 'part name')}\nto\n{name}"
    if _uuid_set(e):
        out += f"\nto_uuid\n{e.new_part_uuid}"
    if e.alter_version != -1:
        out += f"\nalter_version\n{e.alter_version}"
    return out


def _write_alter(e: LogEntry, name: str) -> str:
    columns, metadata = encode(e.columns_str), encode(e.metadata_str)
    return (f"alter\nalter_version\n{e.alter_version}\nhave_mutation\n{int(e.have_mutation)}\n"
            f"columns_str_size:\n{len(columns)}\n{e.columns_str}\n"
            f"metadata_str_size:\n{len(metadata)}\n{e.metadata_str}")


#: type -> its body text (``name`` is the checked ``new_part_name``), without the body's final LF
_BODY_WRITERS: dict[LogEntryType, Callable[[LogEntry, str], str]] = {
    LogEntryType.GET_PART: lambda e, name: f"get\n{name}",
    LogEntryType.ATTACH_PART: lambda e, name: (
        f"attach\n{name}\npart_checksum: {check_raw(e.part_checksum, 'checksum')}"),
    LogEntryType.MERGE_PARTS: _write_merge,
    LogEntryType.DROP_RANGE: lambda e, name: ("detach\n" if e.detach else "drop\n") + name,
    LogEntryType.DROP_PART: lambda e, name: ("detach\n" if e.detach else "drop\n") + name,
    LogEntryType.CLEAR_COLUMN: lambda e, name: f"clear_column\n{escape(e.column_name)}\nfrom\n{name}",
    LogEntryType.CLEAR_INDEX: lambda e, name: f"clear_index\n{escape(e.index_name)}\nfrom\n{name}",
    LogEntryType.REPLACE_RANGE: _write_replace_range,
    LogEntryType.MUTATE_PART: _write_mutate,
    LogEntryType.ALTER_METADATA: _write_alter,
    LogEntryType.SYNC_PINNED_PART_UUIDS: lambda e, name: "sync_pinned_part_uuids\n",
    LogEntryType.CLONE_PART_FROM_SHARD: lambda e, name: (
        f"clone_part_from_shard\n{name}\nsource_shard: {check_raw(e.source_shard, 'shard')}"),
}


@dataclass(frozen=True)
class _Body:
    """What a body reader knows besides the text: its keyword and the header's format version."""

    keyword: str
    version: int
    data_format_version: int


def _read_get(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.GET_PART
    f["new_part_name"] = r.raw()
    return False


def _read_attach(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.ATTACH_PART
    f["new_part_name"] = r.raw()
    r.expect(b"\npart_checksum: ")
    f["part_checksum"] = r.raw()
    return False


def _read_merge(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.MERGE_PARTS
    sources: list[str] = []
    while True:
        if r.eof():
            raise r.error("merge entry without 'into'")
        s = r.raw()
        r.expect(b"\n")
        if s == "into":
            break
        sources.append(s)
    f["source_parts"] = tuple(sources)
    f["new_part_name"] = r.raw()
    if b.version < 4:
        return False
    r.expect(b"\ndeduplicate: ")
    f["deduplicate"] = r.boolean()
    return _read_merge_options(r, f)


def _read_drop(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    name = r.raw()
    f["new_part_name"] = name
    f["detach"] = b.keyword == "detach"
    fake = is_fake_drop_range_name(name, b.data_format_version)
    f["type"] = LogEntryType.DROP_RANGE if fake else LogEntryType.DROP_PART
    return False


def _read_clear(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    column = b.keyword == "clear_column"
    f["type"] = LogEntryType.CLEAR_COLUMN if column else LogEntryType.CLEAR_INDEX
    f["column_name" if column else "index_name"] = r.escaped()
    r.expect(b"\nfrom\n")
    f["new_part_name"] = r.raw()
    return False


def _read_replace_range(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.REPLACE_RANGE
    f["replace_range"] = ReplaceRangeEntry.read(r)
    return False


def _read_mutate(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.MUTATE_PART
    f["source_parts"] = (r.raw(),)
    r.expect(b"\nto\n")
    f["new_part_name"] = r.raw()
    while True:
        r.expect(b"\n")
        if r.check(b"alter_version\n"):
            f["alter_version"] = r.integer()
        elif r.check(b"to_uuid\n"):
            f["new_part_uuid"] = r.uuid()
        else:
            return True


def _read_alter(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.ALTER_METADATA
    r.expect(b"alter_version\n")
    f["alter_version"] = r.integer()
    r.expect(b"\nhave_mutation\n")
    f["have_mutation"] = r.boolean()
    r.expect(b"\ncolumns_str_size:\n")
    n = r.unsigned()
    r.expect(b"\n")
    f["columns_str"] = decode(r.take(n))
    r.expect(b"\nmetadata_str_size:\n")
    n = r.unsigned()
    r.expect(b"\n")
    f["metadata_str"] = decode(r.take(n))
    return False


def _read_sync_pinned(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.SYNC_PINNED_PART_UUIDS
    return False


def _read_clone(r: TextReader, f: dict[str, object], b: _Body) -> bool:
    f["type"] = LogEntryType.CLONE_PART_FROM_SHARD
    f["new_part_name"] = r.raw()
    r.expect(b"\nsource_shard: ")
    f["source_shard"] = r.raw()
    return False


#: the body's keyword line -> its reader, which fills the entry's fields and returns True when it consumed
#: the body's final LF itself (the bodies with optional lines read one line past their end)
_BODY_READERS: dict[str, Callable[[TextReader, dict[str, object], _Body], bool]] = {
    "get": _read_get,
    "attach": _read_attach,
    "merge": _read_merge,
    "drop": _read_drop,
    "detach": _read_drop,
    "clear_column": _read_clear,
    "clear_index": _read_clear,
    "REPLACE_RANGE": _read_replace_range,
    "mutate": _read_mutate,
    "alter": _read_alter,
    "sync_pinned_part_uuids": _read_sync_pinned,
    "clone_part_from_shard": _read_clone,
}
