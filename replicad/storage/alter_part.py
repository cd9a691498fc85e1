"""Converting a part to the table's columns after an ALTER, as 18.16's ``MergeTreeData::alterDataPart``.

* A column the table gained (ADD COLUMN): nothing on disk; the part reads it as its default.
* A column the table lost (DROP COLUMN): its files (``<col>.bin``/``.mrk`` and its substreams
  ``<col>.null.bin`` …; the ``<nested>.size0`` sizes only when no remaining column of that Nested shares
  them) leave the part, and ``columns.txt`` / ``checksums.txt`` are rewritten without them.
* A column whose type changed (MODIFY COLUMN): its values are read with the part's type, converted with
  ``CAST(c, 'NewType')`` and its streams written again (same granules); the other files stay as they are.

:func:`plan_conversion` says what to do (None: the part already fits); :func:`prepare` writes the new
``columns.txt`` / ``checksums.txt`` next to the old ones as ``*.alter.tmp`` (the old part stays intact);
:func:`finish` renames them into place and removes the dropped files; :func:`abandon` removes the tmp files.
Blocking functions: call them in a worker thread.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from replicad.datatypes import DataType, escape_for_file_name, parse_type
from replicad.errors import ReplicadError
from replicad.sql.expressions import compile_expression
from replicad.sql.expressions_lexer import back_quote_if_needed, quote_string
from replicad.storage.checksums import Checksums
from replicad.storage.part import PartDirectory, columns_text, nested_table_name
from replicad.storage.reader import PartReader
from replicad.storage.writer import PartWriter, WriterSettings

_TMP = ".alter.tmp"
_STAGING = "alter_columns.tmp"
_DATA_EXTENSIONS = (".bin", ".mrk", ".mrk2")


@dataclass(frozen=True)
class Conversion:
    """What converting one part does: the files it removes and its new metadata texts."""

    dropped_columns: tuple[str, ...]
    removed_files: tuple[str, ...]
    columns_text: str
    checksums: Checksums
    retyped: tuple[tuple[str, DataType], ...] = ()  # (column, new type): streams written by prepare()
    new_files: tuple[str, ...] = ()  # written by prepare() into the staging directory


def _stem(file_name: str) -> str | None:
    for ext in _DATA_EXTENSIONS:
        if file_name.endswith(ext):
            return file_name[: -len(ext)]
    return None


def column_files(column: str, files: Sequence[str], remaining: Sequence[str]) -> list[str]:
    """The data files of ``column`` among ``files``; shared Nested sizes stay while ``remaining`` columns
    of the same Nested table use them."""
    esc = escape_for_file_name(column)
    nested = nested_table_name(column)
    shared_sizes_used = nested != column and any(
        nested_table_name(r) == nested for r in remaining if r != column)
    esc_nested = escape_for_file_name(nested)
    out = []
    for f in files:
        stem = _stem(f)
        if stem is None:
            continue
        if stem == esc or stem.startswith(esc + "."):
            out.append(f)
        elif (nested != column and not shared_sizes_used and stem.startswith(esc_nested + ".size")
              and stem[len(esc_nested) + 5:].isdigit()):
            out.append(f)
    return out


def plan_conversion(part: PartDirectory, table_columns: Sequence[tuple[str, DataType]]) -> Conversion | None:
    """What makes ``part`` fit ``table_columns`` (None: nothing): columns to drop, columns to retype."""
    wanted = dict(table_columns)
    part_columns = part.column_types
    dropped = [n for n, _t in part_columns if n not in wanted]
    retyped = [(n, wanted[n]) for n, t in part_columns
               if n in wanted and t != wanted[n].name and parse_type(t) != wanted[n]]
    if not dropped and not retyped:
        return None
    kept = [(n, wanted[n].name if n in dict(retyped) else t) for n, t in part_columns if n in wanted]
    if not kept:
        return None  # a part must keep a column; 18.16 refuses to drop the last one, never happens here
    checksums = part.checksums
    files = list(checksums.files)
    removed: list[str] = []
    for col in dropped + [n for n, _t in retyped]:
        removed += column_files(col, files, [n for n, _t in kept if n not in dict(retyped)])
    new_checksums = Checksums({k: v for k, v in checksums.files.items() if k not in set(removed)})
    return Conversion(tuple(dropped), tuple(sorted(set(removed))), columns_text(kept), new_checksums,
                      tuple(retyped))


def _write_retyped(part: PartDirectory, conversion: Conversion, settings: WriterSettings,
                   tz: str) -> Conversion:
    """The retyped columns' streams, written into ``<part>/alter.tmp/``; the conversion with their files."""
    old_types = {n: parse_type(t) for n, t in part.column_types}
    names = [n for n, _t in conversion.retyped]
    staging = part.path / _STAGING
    with PartReader(part, {n: old_types[n] for n in names},
                    index_granularity=settings.index_granularity) as reader:
        if reader.layout.adaptive:
            raise ReplicadError(f"part {part.name}: changing a column's type in a part with adaptive "
                                "granularity is not supported by replicad", code=48)
        casts = {n: compile_expression(f"CAST({back_quote_if_needed(n)}, {quote_string(t.name)})")
                 for n, t in conversion.retyped}
        new_types = dict(conversion.retyped)
        writer = PartWriter(staging, list(conversion.retyped), settings)
        with writer:
            for batch in reader.iter_batches(names, 16):
                arrays = []
                for n in names:
                    arr, _t = casts[n].evaluate(batch, old_types, tz)
                    if isinstance(arr, pa.ChunkedArray):
                        arr = arr.combine_chunks()
                    dtype = new_types[n]
                    if arr.type != dtype.arrow_type or (not dtype.is_nullable and arr.null_count):
                        arr = dtype.to_storage(arr, n, tz)
                    arrays.append(arr)
                writer.write(pa.table(arrays, names=names))
            written = writer.finish()
    streams = {f: c for f, c in written.checksums.files.items() if _stem(f) is not None}
    files = dict(conversion.checksums.files)
    files.update(streams)
    return dataclasses.replace(conversion, checksums=Checksums(files),
                               new_files=tuple(sorted(streams)))


def prepare(path: Path, conversion: Conversion, settings: WriterSettings | None = None,
            tz: str = "UTC") -> Conversion:
    """Write the retyped columns' streams and the new metadata files beside the part's (the part itself
    is unchanged); the conversion as :func:`finish` completes it."""
    if conversion.retyped:
        shutil.rmtree(path / _STAGING, ignore_errors=True)
        conversion = _write_retyped(PartDirectory.at(path), conversion, settings or WriterSettings(), tz)
    for name, data in (("columns.txt", conversion.columns_text.encode()),
                       ("checksums.txt", conversion.checksums.to_bytes())):
        with open(path / (name + _TMP), "wb") as f:
            f.write(data)
    return conversion


def finish(path: Path, conversion: Conversion) -> PartDirectory:
    """Put the new metadata files in place, remove the dropped files; the part directory, re-read."""
    for f in conversion.removed_files:
        if f not in conversion.new_files:
            try:
                os.unlink(path / f)
            except FileNotFoundError:
                pass
    for f in conversion.new_files:
        os.replace(path / _STAGING / f, path / f)
    shutil.rmtree(path / _STAGING, ignore_errors=True)
    for name in ("columns.txt", "checksums.txt"):
        os.replace(path / (name + _TMP), path / name)
    return PartDirectory.at(path).preload()


def abandon(path: Path) -> None:
    shutil.rmtree(path / _STAGING, ignore_errors=True)
    for name in ("columns.txt", "checksums.txt"):
        try:
            os.unlink(path / (name + _TMP))
        except FileNotFoundError:
            pass
