"""Replicated ALTER of columns (ADD / DROP / MODIFY / COMMENT COLUMN), as ClickHouse 18.16 does it.

A comment is set only on a column with a DEFAULT / MATERIALIZED / ALIAS expression: 18.16's reader of the
``columns`` text skips a column whose line has a comment but no expression (its parts then lose the column,
as after 18.16's own COMMENT COLUMN on such a column), so replicad refuses to write one (48).

The initiator (any replica, :meth:`TableAlter.execute`) computes the new column list from its own, sets
the table's ``columns`` znode guarded by the version it read, then waits until every replica with an
``is_active`` node shows the same text in ``replicas/<r>/columns`` (``replication_alter_columns_timeout``,
60 s; code 341 with 18.16's message on timeout, the ALTER then finishing asynchronously).

Every replica runs the alter task (18.16's ReplicatedMergeTreeAlterThread): on a change of the ``columns``
znode (a data watch, and a periodic look) it

1. takes the new columns (refusing clearly what it cannot represent),
2. swaps its in-memory structure (schema, reader, insert sink, fetch check) while no insert block is
   between its write and its commit (:class:`StructureGate`), and rewrites its persisted DDL,
3. converts its active parts (:mod:`replicad.storage.alter_part`: ADD needs nothing on disk, DROP removes
   the column's files, MODIFY of a type rewrites the column's streams with CAST), updating
   ``replicas/<me>/parts/<p>/columns`` and ``checksums`` in one multi each,
4. then sets ``replicas/<me>/columns`` (and ``metadata`` when it differs) to the table's.

Parts that arrive later with a dropped column (an old merge, a fetch from a replica not yet converted) are
converted by the same task's next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from replicad.errors import (
    BadInputError,
    KeeperBadVersionError,
    KeeperMultiError,
    KeeperNoNodeError,
    ReadOnlyError,
    ReplicadError,
    ZnodeFormatError,
)
from replicad.keeper.ops import Set
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntryType
from replicad.model.queue_entry import Selected
from replicad.replication.commit import ColumnsVersionChangedError, CommitResult, TempPart
from replicad.replication.init import default_columns_comparer
from replicad.replication.sink import InsertContext, TableSchema, column_defaults, write_block
from replicad.service import ExecuteResult, Statement, StatementKind
from replicad.sql.ddl import (
    TableDef,
    column_definition,
    description_definition,
    parse_create_table,
    render_create_table,
    with_comment,
)
from replicad.sql.table_metadata import ColumnsDescription, TableMetadata
from replicad.storage import alter_part
from replicad.storage.part import columns_text as part_columns_text
from replicad.tasks import IDLE, IDLE_RECHECK_S, FunctionTask, Outcome

log = get_logger(__name__)

ILLEGAL_COLUMN = 44
NOT_IMPLEMENTED = 48
UNFINISHED = 341
DEFAULT_TIMEOUT_S = 60
_ERROR_DELAY_S = 10.0  # 18.16's ALTER_ERROR_SLEEP_MS


#: metadata fields an ALTER may change that replicad would have to serve (format markers are ignored)
_SERVED_METADATA = frozenset((
    "sampling_expression", "primary_key", "partition_key", "sorting_key", "ttl_table", "skip_indices",
    "projections", "constraints", "date_column", "sign_column", "merging_params_mode", "version_column",
    "is_deleted_column", "columns_to_sum"))


class AlterNotFinishedError(ReplicadError):
    code = UNFINISHED


# ---------------------------------------------------------------------------------------------- columns


def key_columns(table: TableDef) -> set[str]:
    exprs = [*table.sorting_key, *table.primary_key_expressions, *table.partition_key.expressions]
    out = {c for e in exprs for c in e.columns}
    if table.sample_by:
        out.add(table.sample_by.strip("`"))
    return out


def apply_column_commands(table: TableDef, commands: Sequence[Any]) -> TableDef:
    """``table`` with the ADD / DROP / MODIFY COLUMN ``commands`` applied, re-parsed (so defaults, keys and
    types are validated as CREATE TABLE validates them).  Errors carry 18.16's codes and messages."""
    cols = [(c.name, column_definition(c)) for c in table.columns]
    keys = key_columns(table)
    current = {c.name: c for c in table.columns}

    def index(name: str) -> int | None:
        return next((i for i, (n, _d) in enumerate(cols) if n == name), None)

    for cmd in commands:
        at = index(cmd.name)
        if cmd.kind == "ADD":
            if at is not None:
                if cmd.if_exists:
                    continue
                raise ReplicadError(f"Cannot add column {cmd.name}: column with this name already exists",
                                    code=ILLEGAL_COLUMN)
            pos = len(cols)
            if cmd.after is not None:
                after = index(cmd.after)
                if after is None:
                    raise ReplicadError(f"Wrong column name. Cannot find column {cmd.after} to insert after",
                                        code=ILLEGAL_COLUMN)
                pos = after + 1
            cols.insert(pos, (cmd.name, cmd.definition))
        elif cmd.kind == "DROP":
            if at is None:
                if cmd.if_exists:
                    continue
                raise ReplicadError(f"Wrong column name. Cannot find column {cmd.name} to drop",
                                    code=ILLEGAL_COLUMN)
            if cmd.name in keys:
                raise ReplicadError(f"trying to ALTER key column {cmd.name}", code=ILLEGAL_COLUMN)
            del cols[at]
        elif cmd.kind == "MODIFY":
            if at is None:
                if cmd.if_exists:
                    continue
                raise ReplicadError(f"Wrong column name. Cannot find column {cmd.name} to modify",
                                    code=ILLEGAL_COLUMN)
            cols[at] = (cmd.name, cmd.definition)
        else:  # COMMENT COLUMN: the column as it is, with the new comment ('' removes it)
            if at is None:
                if cmd.if_exists:
                    continue
                raise ReplicadError(f"Wrong column name. Cannot find column {cmd.name} to comment",
                                    code=ILLEGAL_COLUMN)
            cols[at] = (cmd.name, with_comment(cols[at][1], cmd.definition))
    new = parse_create_table(render_create_table(table, [d for _n, d in cols]))
    for c in new.columns:  # a type change converts the parts (alter_part); never a key column's
        old = current.get(c.name)
        if old is not None and old.type.name != c.type.name and c.name in keys:
            raise ReplicadError(f"trying to ALTER key column {c.name}", code=ILLEGAL_COLUMN)
        if old is not None and old.is_physical != c.is_physical:
            raise ReplicadError(f"MODIFY COLUMN {c.name}: turning a stored column into an ALIAS (or back) "
                                "is not supported by replicad", code=NOT_IMPLEMENTED)
        if c.comment and not c.default_kind and (old is None or (old.comment, old.default_kind) != (
                c.comment, c.default_kind)):
            raise _plain_comment_error(c.name)
    return new


def _plain_comment_error(name: str) -> ReplicadError:
    """The client's statement is what cannot be carried out: a 400 with ClickHouse's code 48."""
    return BadInputError(
        f"A comment on column {name}, which has no DEFAULT/MATERIALIZED/ALIAS expression, is not "
        "set by replicad: a ClickHouse 18.16 replica reads such a column of the columns znode as no "
        "column at all and drops it from its parts (its own COMMENT COLUMN does the same); only "
        "columns with an expression take a comment", code=NOT_IMPLEMENTED)


def refuse_plain_column_comments(table: TableDef) -> None:
    """A client's CREATE of a replicated table: the same refusal as an ALTER's (48) for a comment on a column
    without an expression, since the ``columns`` znode it would write loses that column on 18.16 replicas."""
    if table.replicated:
        for c in table.columns:
            if c.comment and not c.default_kind:
                raise _plain_comment_error(c.name)


def table_with_columns(table: TableDef, columns_text: str) -> TableDef:
    """``table`` with the columns of a ``columns`` znode text (how a replica follows another's ALTER);
    ReplicadError (code 48) when they cannot be represented exactly."""
    try:
        described = ColumnsDescription.parse(columns_text)
    except ZnodeFormatError as e:
        raise ReplicadError(f"Cannot follow the ALTER: unreadable columns in ZooKeeper: {e}",
                            code=NOT_IMPLEMENTED) from e
    if any(c.extras or c.default_kind == "EPHEMERAL" for c in described.columns):
        raise ReplicadError("Cannot follow the ALTER: the columns use CODEC/TTL/EPHEMERAL, which replicad "
                            "does not serve", code=NOT_IMPLEMENTED)
    try:
        new = parse_create_table(render_create_table(
            table, [description_definition(c) for c in described.columns]))
    except ReplicadError as e:
        raise ReplicadError(f"Cannot follow the ALTER: {e}", code=NOT_IMPLEMENTED) from e
    diffs = default_columns_comparer(new.columns_text(), columns_text)
    if diffs:
        raise ReplicadError("Cannot follow the ALTER: " + "; ".join(diffs), code=NOT_IMPLEMENTED)
    return new


# ---------------------------------------------------------------------------------------------- the gate


class StructureGate:
    """Insert blocks (write + commit) hold it shared; swapping the table structure holds it alone."""

    def __init__(self) -> None:
        self._users = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._users += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def exclusive(self, timeout_s: float) -> AsyncIterator[None]:
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                raise ReplicadError("ALTER: insert blocks in flight did not finish", retriable=True) from None
            yield
        finally:
            self._open.set()


# ---------------------------------------------------------------------------------------------- per table


class TableAlter:
    """The ALTER statement and the alter task of one table replica."""

    def __init__(self, replica: Any, period_s: float = IDLE_RECHECK_S) -> None:
        """``replica``: the ``TableReplica`` (its spec, structure, schema, reader and fetch check are what an
        ALTER changes; the layers keep this module from naming its class)."""
        self.r = replica
        self.task = FunctionTask(f"{replica.spec.name}:alter", self.run_once, period_s=period_s)
        self.gate = StructureGate()
        self._apply_lock = asyncio.Lock()
        self._initiate_lock = asyncio.Lock()
        #: rewrites the persisted CREATE statement (set by the catalog); None: not persisted
        self.persist_ddl: Callable[[str], Awaitable[None]] | None = None
        self.table = parse_create_table(replica.spec.ddl) if replica.spec.ddl else _table_of(replica)
        self._published: tuple[str, int] | None = None  # (columns text, version) last published
        replica.executor.handlers[LogEntryType.ALTER_METADATA] = self.execute_alter_metadata

    def handlers(self) -> dict[StatementKind, Callable[[Statement], Awaitable[ExecuteResult]]]:
        return {StatementKind.ALTER_COLUMNS: self.execute}

    def _watch(self, _event: object) -> None:
        self._published = None  # look at everything again (a session change fires watches too)
        self.task.wakeup()

    # ---- following -----------------------------------------------------------------------------------

    async def run_once(self) -> Outcome:
        r = self.r
        if r.is_readonly or r.structure is None:
            return Outcome("readonly", delay_s=1.0)
        try:
            async with self._apply_lock:
                return await self._follow()
        except ReplicadError as e:
            if e.code == NOT_IMPLEMENTED:
                log.error("alter_not_followed", table=str(r.spec.name), error=str(e))
            else:
                log.warning("alter_failed", table=str(r.spec.name), error=str(e))
            return Outcome("alter_failed", delay_s=_ERROR_DELAY_S, fields={"error": str(e)})

    async def _follow(self) -> Outcome:
        r = self.r
        raw, stat = await r.keeper.get(r.paths.columns, watch=self._watch)
        zk_text = raw.decode()
        assert r.structure is not None
        applied = False
        # a new version, or columns other than ours (a restart after an ALTER made while we were away);
        # texts that differ only in formatting are the same columns
        differ = default_columns_comparer(r.spec.columns_text, zk_text)
        if stat.version != r.structure.columns_version or differ:
            await self._apply(zk_text, stat.version)
            applied = True
        converted = await self._convert_parts()
        published = False
        if applied or converted or self._published != (zk_text, stat.version):
            published = await self._publish(zk_text)
            self._published = (zk_text, stat.version)
        if applied or converted or published:
            return Outcome("altered", did_work=True,
                           fields={"columns_version": stat.version, "parts_converted": converted})
        return IDLE

    async def catch_up(self) -> None:
        """Apply the table's current columns now (an insert whose commit met a newer ``columns``)."""
        async with self._apply_lock:
            await self._follow()

    async def _apply(self, zk_text: str, version: int) -> None:
        r = self.r
        assert r.structure is not None
        if self.table is None:
            raise ReplicadError("Cannot follow the ALTER: the table's DDL is unknown", code=NOT_IMPLEMENTED)
        if default_columns_comparer(r.spec.columns_text, zk_text):
            new_table = table_with_columns(self.table, zk_text)
            new_ddl = render_create_table(new_table, [column_definition(c) for c in new_table.columns])
        else:  # the same columns (a version bump, or texts that differ only in formatting)
            new_table, new_ddl = self.table, r.spec.ddl
        columns = tuple((c.name, c.type) for c in new_table.columns if c.is_physical)
        spec = dataclasses.replace(r.spec, columns=columns, columns_text=new_table.columns_text(),
                                   ddl=new_ddl)
        schema = TableSchema(spec.columns, spec.partition_by, spec.order_by, spec.primary_key, r.env.tz,
                             defaults=column_defaults(spec.columns_text))
        reader = type(r.reader)(spec.columns, [n for n, _t in schema.insertable_columns], r.store, r.env.tz,
                                on_broken_part=r.enqueue_part_check, schema=schema)
        async with self.gate.exclusive(timeout_s=30.0):
            r.spec = spec
            _swap(r.schema, schema)
            _swap(r.reader, reader)
            r.fetcher.table_columns_text = spec.columns_text
            r.fetcher.part_columns_text = part_columns_text(spec.columns)
            r.structure = dataclasses.replace(r.structure, columns_text=zk_text, columns_version=version)
            self.table = new_table
        if self.persist_ddl is not None:
            await self.persist_ddl(new_ddl)
        log.info("alter_applied", table=str(r.spec.name), columns_version=version,
                 columns=[n for n, _t in columns])

    async def _convert_parts(self) -> int:
        r = self.r
        n = 0
        for part in r.store.active():
            conv = alter_part.plan_conversion(part.directory, r.schema.columns)
            if conv is None:
                continue
            conv = await asyncio.to_thread(alter_part.prepare, part.path, conv, r.writer_settings, r.env.tz)
            me = r.paths.me
            try:
                await r.keeper.multi([
                    Set(me.part_columns(part.name), conv.columns_text.encode()),
                    Set(me.part_checksums(part.name), conv.checksums.minimalistic_text()),
                ])
            except KeeperMultiError as e:
                if not isinstance(e.cause, KeeperNoNodeError):
                    await asyncio.to_thread(alter_part.abandon, part.path)
                    raise
                log.warning("alter_part_not_in_zookeeper", part=part.name)  # the part check decides
            except BaseException:
                await asyncio.to_thread(alter_part.abandon, part.path)
                raise
            part.directory = await asyncio.to_thread(alter_part.finish, part.path, conv)
            log.info("part_altered", part=part.name, dropped=list(conv.dropped_columns),
                     retyped=[n for n, _t in conv.retyped])
            n += 1
        return n

    async def _publish(self, zk_text: str) -> bool:
        """``replicas/<me>/columns`` (and ``metadata``) = the table's, once our parts fit."""
        r = self.r
        me = r.paths.me
        mine, _stat = await r.keeper.get(me.columns)
        changed = False
        if mine.decode() != zk_text:
            await r.keeper.set(me.columns, zk_text.encode())
            changed = True
        metadata, _ = await r.keeper.get(r.paths.metadata)
        my_metadata, _ = await r.keeper.get(me.metadata)
        if my_metadata != metadata:
            await r.keeper.set(me.metadata, metadata)
            changed = True
        if changed:
            log.info("alter_published", table=str(r.spec.name))
        return changed

    # ---- current ClickHouse's ALTER_METADATA entries --------------------------------------------------

    async def execute_alter_metadata(self, selected: Selected) -> None:
        """An ``ALTER_METADATA`` log entry (20.x+): its writer also set the table's ``columns``, which the
        alter task follows; here the entry's columns are checked (what replicad cannot serve stays in the
        queue with a clear error), the table's columns applied, then ``replicas/<me>/metadata_version`` set
        to the entry's ``alter_version``.  A change of the table ``metadata`` (keys, TTL, indices) is
        refused (code 48): replicad serves none."""
        r = self.r
        entry = selected.entry
        if self.table is not None:
            table_with_columns(self.table, entry.columns_str)  # raises 48 with the reason
        if entry.metadata_str and r.structure is not None:
            try:
                diffs = TableMetadata.parse(entry.metadata_str).differences(
                    TableMetadata.parse(r.structure.metadata_text))
            except ZnodeFormatError as e:
                raise ReplicadError(f"ALTER_METADATA: unreadable metadata: {e}", code=NOT_IMPLEMENTED) from e
            diffs = [d for d in diffs if d.field in _SERVED_METADATA]
            if diffs:
                raise ReplicadError("ALTER_METADATA changes the table's metadata, which replicad does not "
                                    "serve: " + "; ".join(d.message() for d in diffs), code=NOT_IMPLEMENTED)
        await self.catch_up()
        path = f"{r.paths.me.root}/metadata_version"
        data = str(entry.alter_version).encode()
        try:
            await r.keeper.set(path, data)
        except KeeperNoNodeError:
            await r.keeper.create(path, data)
        log.info("alter_metadata_executed", table=str(r.spec.name), alter_version=entry.alter_version)

    # ---- inserting ------------------------------------------------------------------------------------

    async def write_and_commit(self, table: pa.Table, ctx: InsertContext,
                               commit: Callable[[TempPart], Awaitable[CommitResult]]
                               ) -> list[tuple[TempPart, CommitResult]]:
        """Write one insert block and commit its parts while the table structure stays.  A commit that meets
        a newer ``columns`` (an ALTER between the write and the commit) applies the ALTER here and writes the
        block again, without the partitions already committed (their new part would carry other columns
        and so another block id: it would not deduplicate)."""
        r = self.r
        out: list[tuple[TempPart, CommitResult]] = []
        done: set[str] = set()
        for attempt in range(4):
            try:
                async with self.gate.shared():
                    # the first part's lock taken while it is written (not on a retry: a partition already
                    # committed is written again, then dropped, without a commit to use its lock)
                    early = None if done else r.committer.early_lock(
                        deduplicate=ctx.deduplicate, token=ctx.token, ordinal=ctx.ordinal)
                    temp_parts = await write_block(table, r.schema, r.layout, r.writer_settings, ctx,
                                                   early=early)
                    skipped = [tp.path for tp in temp_parts if tp.partition_id in done]
                    if skipped:
                        await asyncio.to_thread(_remove_dirs, skipped)
                    for tp in temp_parts:
                        if tp.partition_id not in done:
                            out.append((tp, await commit(tp)))
                            done.add(tp.partition_id)
                return out
            except ColumnsVersionChangedError:
                if attempt == 3:
                    raise
                await self.catch_up()
        return out

    # ---- initiating ----------------------------------------------------------------------------------

    async def execute(self, statement: Statement) -> ExecuteResult:
        from replicad.sql.statements import Alter, ColumnCommand

        r = self.r
        parsed = statement.parsed
        if not isinstance(parsed, Alter):
            raise ReplicadError("ALTER: the statement could not be parsed", code=62)
        commands = list(parsed.commands)
        if not all(isinstance(c, ColumnCommand) for c in commands):
            raise ReplicadError("ALTER mixing column commands with other commands is not supported by "
                                "replicad", code=NOT_IMPLEMENTED)
        if parsed.on_cluster is not None:
            raise ReplicadError("ALTER … ON CLUSTER is not supported by replicad yet", code=NOT_IMPLEMENTED)
        if r.is_readonly:
            raise ReadOnlyError(f"Table {r.spec.name} is in readonly mode")
        timeout = float(statement.settings.get("replication_alter_columns_timeout", DEFAULT_TIMEOUT_S))
        async with self._initiate_lock:
            new_text, version = await self._set_columns(commands)
        if new_text is None:
            return ExecuteResult()
        self.task.wakeup()
        await self._wait_replicas(new_text, version, timeout)
        return ExecuteResult()

    async def _set_columns(self, commands: list[Any]) -> tuple[str | None, int]:
        r = self.r
        for _attempt in range(10):
            await self.catch_up()
            raw, stat = await r.keeper.get(r.paths.columns)
            assert r.structure is not None
            if stat.version != r.structure.columns_version or self.table is None:
                await asyncio.sleep(0.1)
                continue
            new = apply_column_commands(self.table, commands)
            new_text = new.columns_text()
            if new_text == raw.decode():
                return None, stat.version
            try:
                await r.keeper.set(r.paths.columns, new_text.encode(), stat.version)
            except KeeperBadVersionError:
                continue  # another ALTER came first: apply it, then ours on top
            log.info("alter_columns_set", table=str(r.spec.name), version=stat.version + 1)
            return new_text, stat.version + 1
        raise ReplicadError("ALTER: the table's columns keep changing under this ALTER", code=UNFINISHED)

    async def _wait_replicas(self, new_text: str, version: int, timeout_s: float) -> None:
        r = self.r
        deadline = time.monotonic() + timeout_s
        pending = sorted(await r.keeper.get_children(r.paths.replicas))
        while pending:
            still = []
            for name in pending:
                rp = r.paths.replica(name)
                if await r.keeper.exists(rp.is_active) is None:
                    continue  # 18.16 waits for active replicas only
                try:
                    theirs, _ = await r.keeper.get(rp.columns)
                except KeeperNoNodeError:
                    continue
                if theirs.decode() != new_text:
                    still.append(name)
            pending = still
            if not pending:
                return
            _raw, stat = await r.keeper.get(r.paths.columns)
            if stat.version != version:
                log.info("alter_overridden", table=str(r.spec.name))  # a later ALTER: as 18.16, stop waiting
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        raise AlterNotFinishedError(
            f"Alter is not finished because timeout when waiting for some replicas: {', '.join(pending)} "
            f"(replication_alter_columns_timeout = {int(timeout_s)}). Alter will be done asynchronously.")


def _table_of(replica: Any) -> TableDef | None:
    """A TableDef for a replica built without DDL (from a TableSpec alone, as tests build them)."""
    s = replica.spec
    base = TableDef(s.name.database, s.name.table, (), "ReplicatedMergeTree", s.zk_path, s.replica_name,
                    s.partition_by, s.order_by or "tuple()", s.primary_key, None,
                    {k: str(v) for k, v in s.settings.items()})
    try:
        return table_with_columns(base, s.columns_text)
    except ReplicadError as e:
        log.warning("alter_table_definition_unknown", table=str(s.name), error=str(e))
        return None


def _remove_dirs(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _swap(target: object, new: object) -> None:
    """Make ``target`` (an object others hold: the schema merges and staging use, the reader) ``new``."""
    target.__dict__.clear()
    target.__dict__.update(new.__dict__)
