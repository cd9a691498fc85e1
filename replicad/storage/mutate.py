"""Applying ``ALTER TABLE … DELETE WHERE`` / ``UPDATE c = expr, … WHERE`` to one part, as ClickHouse 18.16.

What 18.16 does with a part (``MergeTreeDataMergerMutator::mutatePartToTemporaryPart``), checked against a
live 18.16 server (tests/integration/test_merge_clickhouse18.py):

* **Untouched part** — no row satisfies any command's predicate (NULL counts as false): the part is
  cloned under the new name, every file hard-linked, bytes unchanged.
* **UPDATE only** — only the updated columns' streams are rewritten (same granules as the source);
  every other file is hard-linked; ``checksums.txt`` is the source's with those files replaced and
  ``columns.txt`` lists the table's columns that the part has or that were updated.
* **Any DELETE** — the whole part is rewritten (minmax recomputed from the remaining rows).  A row is
  kept only where the predicate is false: a NULL predicate deletes the row (``not(NULL)`` filters out).
  If every row goes, 18.16 keeps an *empty* part (0 rows, empty ``.bin``/``.mrk``/``primary.idx``,
  ``partition.dat`` and ``count.txt`` = ``0``, no ``minmax_*.idx``); so do we.

A source part in a layout 18.16 cannot load (current ClickHouse's Compact parts, String size streams,
sparse columns, compressed marks ...) is always rewritten whole as an 18.16 Wide part, even when no row
is touched.

Commands apply in order, each to the result of the previous ones; the assignments of one UPDATE are
simultaneous (all read the values before the command).  An UPDATE that assigns a column some
MATERIALIZED expression reads then recomputes *every* MATERIALIZED column for *every* row (18.16 adds a
stage for them); those columns are rewritten too.  Columns the part lacks (added by ALTER) are computed
from their DEFAULT/MATERIALIZED expressions (``schema.defaults``), else the type's default.
``UPDATE c = e WHERE p`` stores ``if(p, CAST(e AS type of c), c)`` — CAST wraps integers (``300`` →
UInt8 ``44``) like 18.16.  Updating a sorting-key or partition-key column is refused (code 420
``Cannot UPDATE key column``), as is an unknown column (code 16).

Parts are processed batch by batch (``granules_per_batch`` granules); memory is bounded by a batch.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal as TypingLiteral

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError
from replicad.model.checksums import Checksums
from replicad.sql.expressions import Expr, Val, compile_expression, truthy
from replicad.sql.expressions_ast import Function, Literal
from replicad.storage.merge import DEFAULT_GRANULES_PER_BATCH, TableKeys, TableSchemaLike
from replicad.storage.part import (
    CHECKSUMS_FILE,
    COLUMNS_FILE,
    DATA_EXT,
    PartDirectory,
    columns_text,
    fsync_dir,
    write_file,
)
from replicad.storage.reader import PartReader, incompatibilities_with_18_16
from replicad.storage.types import escape_for_file_name
from replicad.storage.types_composite import filter_rows
from replicad.storage.writer import PartWriter, WriterSettings, WrittenPart

CANNOT_UPDATE_COLUMN = 420
NO_SUCH_COLUMN_IN_TABLE = 16

Kind = TypingLiteral["DELETE", "UPDATE"]


@dataclass(frozen=True)
class MutationCommand:
    """One mutation command: ``DELETE WHERE predicate`` or ``UPDATE col = expr, … WHERE predicate``.

    Expressions are ClickHouse expression text or already compiled :class:`Expr` s.
    """

    kind: Kind
    predicate: str | Expr
    assignments: tuple[tuple[str, str | Expr], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("DELETE", "UPDATE"):
            raise BadInputError(f"unsupported mutation command {self.kind!r}")
        if self.kind == "UPDATE" and not self.assignments:
            raise BadInputError("UPDATE needs at least one assignment")
        if self.kind == "DELETE" and self.assignments:
            raise BadInputError("DELETE takes no assignments")

    @classmethod
    def delete(cls, predicate: str | Expr) -> MutationCommand:
        return cls("DELETE", predicate)

    @classmethod
    def update(cls, assignments: Iterable[tuple[str, str | Expr]], predicate: str | Expr) -> MutationCommand:
        return cls("UPDATE", predicate, tuple((str(c), e) for c, e in assignments))

    @classmethod
    def coerce(cls, command: object) -> MutationCommand:
        """A MutationCommand from itself, a ``(kind, where, assignments)`` tuple, or a record with
        ``kind``/``predicate``/``assignments`` attributes such as ``replicad.sql.statements.MutationCommand``
        (assignments: pairs or a mapping; expressions: text or Expr)."""
        if isinstance(command, MutationCommand):
            return command
        if isinstance(command, tuple) and len(command) in (2, 3):
            kind, predicate = command[0], command[1]
            assignments = command[2] if len(command) == 3 else ()
        else:
            kind = getattr(command, "kind", None)
            predicate = getattr(command, "predicate", None)
            assignments = getattr(command, "assignments", ())
        if isinstance(assignments, dict):
            assignments = list(assignments.items())
        if not isinstance(kind, str) or not isinstance(predicate, str | Expr):
            raise BadInputError(f"not a mutation command: {command!r}")
        pairs = tuple((str(c), e if isinstance(e, Expr) else str(e)) for c, e in assignments)
        return cls(kind.upper(), predicate, pairs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Compiled:
    kind: Kind
    predicate: Expr
    assignments: tuple[tuple[str, Expr], ...]
    #: MATERIALIZED columns recomputed (every row) after the UPDATE: all of them when it assigns a
    #: column that some MATERIALIZED expression reads, else none (18.16)
    materialized: tuple[tuple[str, Expr], ...] = ()

    @property
    def updated(self) -> list[str]:
        return [c for c, _e in self.assignments] + [c for c, _e in self.materialized]

    @property
    def columns(self) -> list[str]:
        out = list(self.predicate.columns)
        for col, e in (*self.assignments, *self.materialized):
            out.append(col)
            out.extend(e.columns)
        return out


def _compiled(e: str | Expr) -> Expr:
    return e if isinstance(e, Expr) else compile_expression(e)


def compile_commands(keys: TableKeys, commands: str | Iterable[object]) -> list[_Compiled]:
    """Parse and validate commands against the table (unknown columns, key columns).

    A string is a mutation entry's command list (``DELETE WHERE x = 2, UPDATE …``)."""
    if isinstance(commands, str):
        from replicad.sql.statements import parse_mutation_commands

        commands = parse_mutation_commands(commands)
    key_columns = keys.sorting_columns | set(keys.partition.columns)
    out: list[_Compiled] = []
    for raw in commands:
        cmd = MutationCommand.coerce(raw)
        predicate = _compiled(cmd.predicate)
        assignments: list[tuple[str, Expr]] = []
        for col, text in cmd.assignments:
            dtype = keys.types.get(col)
            if dtype is None:
                raise BadInputError(f"There is no column `{col}` in table", code=NO_SUCH_COLUMN_IN_TABLE)
            if col in key_columns:
                raise BadInputError(f"Cannot UPDATE key column `{col}`", code=CANNOT_UPDATE_COLUMN)
            cast = Function("CAST", (_compiled(text).node, Literal(dtype.name, "string")))
            assignments.append((col, Expr(cast)))
        assigned = {c for c, _e in assignments}
        affected = any(assigned & set(e.columns) for _c, e in keys.materialized)
        compiled = _Compiled(cmd.kind, predicate, tuple(assignments),
                             tuple(keys.materialized) if affected else ())
        for c in compiled.columns:
            if c not in keys.types:
                raise BadInputError(f"Missing column `{c}` in table", code=NO_SUCH_COLUMN_IN_TABLE)
        out.append(compiled)
    if not out:
        raise BadInputError("a mutation needs at least one command")
    return out


def apply_commands(batch: pa.Table, commands: Sequence[_Compiled], keys: TableKeys) -> pa.Table:
    """The rows of ``batch`` after the commands (DELETE filters, UPDATE replaces columns)."""
    for cmd in commands:
        if batch.num_rows == 0:
            break
        arr, dtype = cmd.predicate.evaluate(batch, keys.types, keys.tz)
        hit = truthy(Val(arr, dtype))
        if cmd.kind == "DELETE":
            keep = ~hit
            if arr.null_count:
                keep &= np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            if not keep.all():
                batch = filter_rows(batch, keep)
            continue
        if hit.any():
            batch = _assign(batch, cmd.assignments, hit, keys)
        if cmd.materialized:
            batch = _replace(batch, {c: keys.computed(c, batch) for c, _e in cmd.materialized})
    return batch


def _replace(batch: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    for col, value in columns.items():
        batch = batch.set_column(batch.schema.get_field_index(col), col, value)
    return batch


def _assign(
    batch: pa.Table, assignments: Sequence[tuple[str, Expr]], hit: npt.NDArray[np.bool_], keys: TableKeys
) -> pa.Table:
    """``c = if(p, CAST(e AS type), c)`` for every assignment, all reading the same (old) rows."""
    mask = pa.array(hit, pa.bool_())
    new_columns: dict[str, pa.Array] = {}
    for col, expr in assignments:
        target = keys.types[col]
        value, _t = expr.evaluate(batch, keys.types, keys.tz)
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        if value.type != target.arrow_type or (not target.is_nullable and value.null_count):
            value = target.to_storage(value, col, keys.tz)
        old_col = batch.column(col)
        old = old_col.combine_chunks() if isinstance(old_col, pa.ChunkedArray) else old_col
        if target.is_nullable and value.null_count == len(value):
            new_columns[col] = _null_where(old, hit)
        else:
            new_columns[col] = pc.if_else(mask, value, old)
    return _replace(batch, new_columns)


def _null_where(old: pa.Array, hit: npt.NDArray[np.bool_]) -> pa.Array:
    """``old`` with the ``hit`` rows set to NULL, their values kept underneath.

    18.16 computes ``if(p, CAST(NULL), c)`` as ``c`` with a new null map, so the nested values of the
    nulled rows stay in ``<c>.bin``; keeping them in the Arrow values buffer lets a writer that writes
    the values under NULL as they are reproduce those bytes.
    """
    valid = ~hit
    if old.null_count:
        valid &= np.asarray(old.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if old.type.num_fields:  # nested values of lists: rebuilt by if_else
        return pc.if_else(pa.array(hit, pa.bool_()), pa.nulls(len(old), old.type), old)
    bits = np.concatenate([np.zeros(old.offset, dtype=bool), valid])
    validity = pa.py_buffer(np.packbits(bits, bitorder="little").tobytes())
    return pa.Array.from_buffers(old.type, len(old), [validity, *old.buffers()[1:]], offset=old.offset)


def _batches(
    reader: PartReader, keys: TableKeys, names: Sequence[str], granules: int
) -> Iterator[pa.Table]:
    """Batches of the ``names`` columns (plus what their DEFAULT expressions read, when the part lacks
    them), with the columns the part lacks computed from their expressions."""
    missing = [c for c in keys.missing_with_defaults(reader) if c in names]
    need = set(names)
    for c in missing:
        need.update(keys.defaults[c][1].columns)
    ordered = [n for n, _t in keys.columns if n in need]
    for batch in reader.iter_batches(ordered, granules):
        yield keys.fill_defaults(batch, missing)


def _touched(reader: PartReader, commands: Sequence[_Compiled], keys: TableKeys, granules: int) -> bool:
    """Does any row satisfy any predicate (on the unmutated rows, as 18.16's ``count() WHERE or(...)``)?"""
    names: list[str] = []
    for cmd in commands:
        names.extend(c for c in cmd.predicate.columns if c not in names)
    if not names:  # constant predicates
        names = [keys.columns[0][0]]
    for batch in _batches(reader, keys, names, granules):
        for cmd in commands:
            arr, dtype = cmd.predicate.evaluate(batch, keys.types, keys.tz)
            if truthy(Val(arr, dtype)).any():
                return True
    return False


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _described(path: Path, marks_count: int) -> WrittenPart:
    part = PartDirectory(path)
    return WrittenPart(path, part.rows, marks_count, part.checksums, part.columns_text, part.bytes_on_disk)


def clone_part(source: PartDirectory, tmp_dir: Path, marks_count: int, fsync: bool = True) -> WrittenPart:
    """The source part's files hard-linked (copied across file systems) into ``tmp_dir``."""
    _fresh_dir(tmp_dir)
    try:
        for name in source.files():
            _link_or_copy(source.path / name, tmp_dir / name)
        if fsync:
            fsync_dir(tmp_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return _described(tmp_dir, marks_count)


def _rewrite_columns(
    source: PartDirectory,
    reader: PartReader,
    tmp_dir: Path,
    keys: TableKeys,
    commands: Sequence[_Compiled],
    settings: WriterSettings,
    granules: int,
) -> WrittenPart:
    """UPDATE without DELETE: rewrite the updated columns, hard-link everything else."""
    assigned = {c for cmd in commands for c in cmd.updated}
    updated = [name for name, _t in keys.columns if name in assigned]
    needed: list[str] = []
    for cmd in commands:
        needed.extend(c for c in cmd.columns if c not in needed)
    read_names = [n for n, _t in keys.columns if n in needed]
    new_streams: set[str] = set()
    for col in updated:
        base = escape_for_file_name(col)
        for suffix in keys.types[col].substreams():
            new_streams.update((base + suffix + DATA_EXT, base + suffix + reader.layout.marks_ext))
    _fresh_dir(tmp_dir)
    try:
        staging = tmp_dir / "updated_columns.tmp"
        writer = PartWriter(staging, [(c, keys.types[c]) for c in updated], settings)
        with writer:
            for batch in _batches(reader, keys, read_names, granules):
                writer.write(apply_commands(batch, commands, keys).select(updated))
            written = writer.finish()
        for name in sorted(new_streams):
            os.replace(staging / name, tmp_dir / name)
        shutil.rmtree(staging)
        skip = new_streams | {CHECKSUMS_FILE, COLUMNS_FILE}
        for name in source.files():
            if name not in skip:
                _link_or_copy(source.path / name, tmp_dir / name)
        files = dict(source.checksums.files)
        files.update({n: c for n, c in written.checksums.files.items() if n in new_streams})
        checksums = Checksums(files=files)
        have = {n for n, _t in source.column_types} | set(updated)
        text = columns_text([(n, t) for n, t in keys.columns if n in have])
        write_file(tmp_dir / COLUMNS_FILE, text.encode("utf-8"), settings.fsync)
        write_file(tmp_dir / CHECKSUMS_FILE, checksums.to_bytes(), settings.fsync)
        if settings.fsync:
            fsync_dir(tmp_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return _described(tmp_dir, reader.granules)


def _rewrite_part(
    source: PartDirectory,
    reader: PartReader,
    tmp_dir: Path,
    keys: TableKeys,
    commands: Sequence[_Compiled],
    settings: WriterSettings,
    granules: int,
) -> WrittenPart:
    """Rewrite every column of the part (a DELETE is involved, or the source's marks are adaptive)."""
    names = [n for n, _t in keys.columns]
    with keys.writer(tmp_dir, settings, keys.partition_value(source)) as writer:
        for batch in _batches(reader, keys, names, granules):
            out = apply_commands(batch, commands, keys)
            if out.num_rows:
                writer.write(out, keys.primary_arrays(out))
        return writer.finish()


def mutate_part(
    source_dir: str | os.PathLike[str],
    tmp_dir: str | os.PathLike[str],
    schema: TableSchemaLike,
    commands: str | Iterable[object],
    settings: WriterSettings | None = None,
    *,
    granules_per_batch: int = DEFAULT_GRANULES_PER_BATCH,
) -> WrittenPart:
    """Apply ``commands`` (in order) to the part in ``source_dir``; the result goes to ``tmp_dir``.

    ``commands``: :class:`MutationCommand` s, ``(kind, where, assignments)`` tuples, records with
    ``kind``/``predicate``/``assignments`` (the sql layer's), or a mutation entry's command text.
    Blocking: run it in a worker thread.
    """
    settings = settings or WriterSettings()
    keys = TableKeys(schema)
    compiled = compile_commands(keys, commands)
    source = PartDirectory(Path(source_dir))
    out = Path(tmp_dir)
    with PartReader(source, keys.types, index_granularity=settings.index_granularity) as reader:
        # A part in a layout 18.16 cannot load (Compact, size streams, sparse ...: written by current
        # ClickHouse) is never cloned or patched: the result is rewritten as an 18.16 Wide part.
        legacy = not incompatibilities_with_18_16(source)
        if legacy and not _touched(reader, compiled, keys, granules_per_batch):
            return clone_part(source, out, reader.granules, settings.fsync)
        only_updates = all(c.kind == "UPDATE" for c in compiled)
        if only_updates and legacy and not reader.layout.adaptive:
            return _rewrite_columns(source, reader, out, keys, compiled, settings, granules_per_batch)
        return _rewrite_part(source, reader, out, keys, compiled, settings, granules_per_batch)


def rewrite_part(
    source_dir: str | os.PathLike[str],
    tmp_dir: str | os.PathLike[str],
    schema: TableSchemaLike,
    settings: WriterSettings | None = None,
    *,
    granules_per_batch: int = DEFAULT_GRANULES_PER_BATCH,
) -> WrittenPart:
    """The part in ``source_dir`` (any layout the reader reads: a Compact part of current ClickHouse ...)
    rewritten as an 18.16 Wide part with the same rows.  Blocking: run it in a worker thread."""
    settings = settings or WriterSettings()
    keys = TableKeys(schema)
    source = PartDirectory(Path(source_dir))
    with PartReader(source, keys.types, index_granularity=settings.index_granularity) as reader:
        return _rewrite_part(source, reader, Path(tmp_dir), keys, [], settings, granules_per_batch)


def iter_mutated(
    source_dir: str | os.PathLike[str],
    schema: TableSchemaLike,
    commands: str | Iterable[object],
    *,
    index_granularity: int = 8192,
    granules_per_batch: int = DEFAULT_GRANULES_PER_BATCH,
) -> Iterator[pa.Table]:
    """The rows a mutation leaves in a part, batch by batch (no part is written)."""
    keys = TableKeys(schema)
    compiled = compile_commands(keys, commands)
    names = [n for n, _t in keys.columns]
    with PartReader(Path(source_dir), keys.types, index_granularity=index_granularity) as reader:
        for batch in _batches(reader, keys, names, granules_per_batch):
            yield apply_commands(batch, compiled, keys)


__all__ = [
    "MutationCommand",
    "apply_commands",
    "clone_part",
    "compile_commands",
    "iter_mutated",
    "mutate_part",
    "rewrite_part",
]
