"""The body of a REPLACE_RANGE log entry (REPLACE/ATTACH PARTITION FROM, MOVE PARTITION), as ClickHouse's
``ReplicatedMergeTreeLogEntryData::ReplaceRangeEntry`` reads and writes it."""

from __future__ import annotations

from dataclasses import dataclass

from replicad.model.text_io import TextReader, check_raw, escape, quote_list


@dataclass(frozen=True)
class ReplaceRangeEntry:
    """Body of a REPLACE_RANGE entry (REPLACE/ATTACH PARTITION FROM, MOVE PARTITION)."""

    drop_range_part_name: str
    from_database: str
    from_table: str
    src_part_names: tuple[str, ...] = ()
    new_part_names: tuple[str, ...] = ()
    part_names_checksums: tuple[str, ...] = ()
    columns_version: int = 0
    #: One modern release wrote an optional escaped ``commands:`` line; None when absent.
    commands: str | None = None

    def to_text(self) -> str:
        out = [
            f"drop_range_name: {check_raw(self.drop_range_part_name, 'drop range name')}\n",
            f"from_database: {escape(self.from_database)}\n",
            f"from_table: {escape(self.from_table)}\n",
        ]
        if self.commands is not None:
            out.append(f"commands: {escape(self.commands)}\n")
        out.append(f"source_parts: {quote_list(self.src_part_names)}\n")
        out.append(f"new_parts: {quote_list(self.new_part_names)}\n")
        out.append(f"part_checksums: {quote_list(self.part_names_checksums)}\n")
        out.append(f"columns_version: {self.columns_version}")
        return "".join(out)

    @classmethod
    def read(cls, r: TextReader) -> ReplaceRangeEntry:
        r.expect(b"drop_range_name: ")
        drop_range = r.raw()
        r.expect(b"\nfrom_database: ")
        from_database = r.escaped()
        r.expect(b"\nfrom_table: ")
        from_table = r.escaped()
        r.expect(b"\n")
        commands = None
        if r.check(b"commands: "):
            commands = r.escaped()
            r.expect(b"\n")
        r.expect(b"source_parts: ")
        src = r.quoted_list()
        r.expect(b"\nnew_parts: ")
        new = r.quoted_list()
        r.expect(b"\npart_checksums: ")
        checksums = r.quoted_list()
        r.expect(b"\ncolumns_version: ")
        columns_version = r.integer()
        return cls(drop_range, from_database, from_table, src, new, checksums, columns_version, commands)
