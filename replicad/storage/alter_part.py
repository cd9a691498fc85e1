"""Converting a part to the table's columns after an ALTER, as 18.16's ``MergeTreeData::alterDataPart``.

* A column the table gained (ADD COLUMN): nothing on disk; the part reads it as its default.
* A column the table lost (DROP COLUMN): its files (``<col>.bin``/``.mrk`` and its substreams
  ``<col>.null.bin`` …; the ``<nested>.size0`` sizes only when no remaining column of that Nested shares
  them) leave the part, and ``columns.txt`` / ``checksums.txt`` are rewritten without them.

:func:`plan_conversion` says what to do (None: the part already fits); :func:`prepare` writes the new
``columns.txt`` / ``checksums.txt`` next to the old ones as ``*.alter.tmp`` (the old part stays intact);
:func:`finish` renames them into place and removes the dropped files; :func:`abandon` removes the tmp files.
Blocking functions: call them in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replicad.model.checksums import Checksums
from replicad.storage.part import PartDirectory, columns_text, nested_table_name
from replicad.storage.types import DataType, escape_for_file_name

_TMP = ".alter.tmp"
_DATA_EXTENSIONS = (".bin", ".mrk", ".mrk2")


@dataclass(frozen=True)
class Conversion:
    """What converting one part does: the files it removes and its new metadata texts."""

    dropped_columns: tuple[str, ...]
    removed_files: tuple[str, ...]
    columns_text: str
    checksums: Checksums


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
    """What makes ``part`` fit ``table_columns`` (None: nothing).  Columns whose type differs are kept as
    they are here (MODIFY COLUMN converts them: :mod:`replicad.storage.alter_part` does not)."""
    wanted = {n for n, _t in table_columns}
    part_columns = part.column_types
    dropped = [n for n, _t in part_columns if n not in wanted]
    if not dropped:
        return None
    kept = [(n, t) for n, t in part_columns if n in wanted]
    if not kept:
        return None  # a part must keep a column; 18.16 refuses to drop the last one, never happens here
    checksums = part.checksums
    files = list(checksums.files)
    removed: list[str] = []
    for col in dropped:
        removed += column_files(col, files, [n for n, _t in kept])
    new_checksums = Checksums({k: v for k, v in checksums.files.items() if k not in set(removed)})
    return Conversion(tuple(dropped), tuple(sorted(set(removed))), columns_text(kept), new_checksums)


def prepare(path: Path, conversion: Conversion) -> None:
    """Write the new metadata files as tmp files beside the part's."""
    for name, data in (("columns.txt", conversion.columns_text.encode()),
                       ("checksums.txt", conversion.checksums.to_bytes())):
        with open(path / (name + _TMP), "wb") as f:
            f.write(data)


def finish(path: Path, conversion: Conversion) -> PartDirectory:
    """Put the new metadata files in place, remove the dropped files; the part directory, re-read."""
    for name in ("columns.txt", "checksums.txt"):
        os.replace(path / (name + _TMP), path / name)
    for f in conversion.removed_files:
        try:
            os.unlink(path / f)
        except FileNotFoundError:
            pass
    return PartDirectory.at(path).preload()


def abandon(path: Path) -> None:
    for name in ("columns.txt", "checksums.txt"):
        try:
            os.unlink(path / (name + _TMP))
        except FileNotFoundError:
            pass
