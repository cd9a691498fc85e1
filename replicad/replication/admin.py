"""Admin statements of one replicated table, done as ClickHouse does them.

* ``ALTER TABLE t ATTACH PART 'p'`` / ``ATTACH PARTITION p``: parts from ``detached/`` are checked (every file
  re-hashed against ``checksums.txt``, columns equal to the table's) and committed as an insert commits an
  existing part (18.16's ``writeExistingPart``): a new block number, so a new level-0 name, a GET_PART log
  entry that the other replicas fetch; no block id (an attached part is never deduplicated).  A part that
  fails the check stays in ``detached/`` under its name, and the statement fails naming it.  A part written
  by current ClickHouse in a layout 18.16 cannot load (Compact, String size streams, sparse columns,
  column codecs, compressed marks ...) is rewritten first as the 18.16 Wide part with the same rows, so
  every replica of a mixed set can fetch and read it.
* ``ALTER TABLE t DROP DETACHED PART 'p'`` / ``DROP DETACHED PARTITION p``: removes directories from this
  replica's ``detached/`` (local, not replicated, as in ClickHouse).
* ``SYSTEM DROP REPLICA 'r' FROM TABLE t``: removes a dead replica's ``replicas/<r>`` subtree (not this
  replica, not an active one), so the log and blocks it pinned can be cleaned.
* ``SYSTEM RESTART REPLICA t``: runs the replica's ZooKeeper start-up again (re-activation, the queue reloaded
  from ZooKeeper, leader election) and waits until it is writable.
* ``SYSTEM STOP|START FETCHES|MERGES``: while stopped, GET_PART (fetches) or MERGE_PARTS/MUTATE_PART (merges)
  entries wait in the queue with a postpone reason instead of failing and being retried, and the leader
  assigns no merges; START wakes the queue.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from replicad.errors import (
    BadInputError,
    CorruptedDataError,
    KeeperNoNodeError,
    ReadOnlyError,
    ReplicadError,
    UnsupportedPartFormatError,
)
from replicad.logging import get_logger
from replicad.model.part_info import PartInfo
from replicad.replication.commit import TempPart
from replicad.replication.table_context import TableContext
from replicad.replication.table_ops import TableOperations
from replicad.service import ExecuteResult, Statement, StatementKind
from replicad.storage.merge import TableSchemaLike
from replicad.storage.mutate import rewrite_part
from replicad.storage.part import PartDirectory, columns_text
from replicad.storage.reader import SYSTEM_COLUMNS, incompatibilities_with_18_16
from replicad.storage.writer import WriterSettings


class AdminContext(TableContext, Protocol):
    """The table as the admin statements see it: its context and its merges/partition operations."""

    @property
    def ops(self) -> TableOperations: ...

log = get_logger(__name__)

BAD_DATA_PART_NAME = 233
NO_SUCH_DATA_PART = 232
INCOMPATIBLE_COLUMNS = 122
TABLE_WAS_NOT_DROPPED = 305
TMP_ATTACH = "tmp_attach_"
TMP_CONVERT = "tmp_convert_"
PATCH_PREFIX = "patch-"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class TableAdmin:
    """The admin statements of one table (see the module docstring)."""

    def __init__(self, replica: AdminContext) -> None:
        self.replica = replica

    def handlers(self) -> dict[StatementKind, Callable[[Statement], Awaitable[ExecuteResult]]]:
        return {
            StatementKind.ATTACH: self.attach,
            StatementKind.DROP_DETACHED: self.drop_detached,
            StatementKind.DROP_REPLICA: self.drop_replica,
            StatementKind.RESTART_REPLICA: self.restart_replica,
            StatementKind.FETCHES: self.stop_start,
            StatementKind.MERGES: self.stop_start,
        }

    # ---- detached parts ---------------------------------------------------------------------------------

    def _detached_command(self, statement: Statement) -> Any:
        parsed = statement.parsed
        commands = [c for c in getattr(parsed, "commands", ()) if type(c).__name__ == "DetachedCommand"]
        if len(commands) != 1 or len(parsed.commands) != 1:
            raise BadInputError("ATTACH / DROP DETACHED must be the only command of its ALTER", code=48)
        return commands[0]

    def _detached_names(self, cmd: Any) -> list[str]:
        layout = self.replica.layout
        if cmd.part is not None:
            name = cmd.part
            if not _SAFE_NAME.fullmatch(name) or name in (".", ".."):
                raise BadInputError(f"Invalid part name {name!r}", code=BAD_DATA_PART_NAME)
            path = layout.detached_path / name
            if not path.is_dir() or path.is_symlink():
                raise BadInputError(f"Detached part {name} not found", code=NO_SUCH_DATA_PART)
            return [name]
        pid = self.replica.ops.partition_id(cmd.partition)
        out = []
        for name in layout.list_detached():
            if name.startswith(PATCH_PREFIX):  # current ClickHouse's lightweight UPDATE: never applied here
                _uuid, _sep, base = name[len(PATCH_PREFIX):].partition("-")
                try:
                    patched = PartInfo.parse(base).partition_id == pid
                except ValueError:
                    patched = False
                if patched:
                    raise BadInputError(
                        f"Detached {name} is a patch part of a lightweight UPDATE, which replicad does not "
                        "apply: let ClickHouse merge it into its parts first (OPTIMIZE TABLE ... FINAL), or "
                        "remove it to attach the parts without the update", code=48)
                continue
            try:
                info = PartInfo.parse(name)
            except ValueError:
                continue  # broken_/unexpected_/ignored_… directories are not attached by partition
            if info.partition_id == pid:
                out.append(name)
        return out

    async def attach(self, statement: Statement) -> ExecuteResult:
        r = self.replica
        if r.is_readonly:
            raise ReadOnlyError(f"Table {r.spec.name} is in readonly mode")
        cmd = self._detached_command(statement)
        names = await asyncio.to_thread(self._detached_names, cmd)
        if cmd.part is not None:
            try:
                PartInfo.parse(cmd.part)
            except ValueError:
                raise BadInputError(f"Invalid part name {cmd.part!r}: not a part name (detached parts with a "
                                    "prefix, e.g. broken_, must be renamed first)",
                                    code=BAD_DATA_PART_NAME) from None
        attached = []
        for name in names:
            attached.append(await self._attach_one(name))
        log.info("parts_attached", table=str(r.spec.name), parts=attached, source=names)
        return ExecuteResult(fields={"parts": attached})

    async def _attach_one(self, name: str) -> str:
        r = self.replica
        info = PartInfo.parse(name)
        src = r.layout.detached_path / name
        tmp = r.layout.tmp_path(TMP_ATTACH, name)
        converted = r.layout.tmp_path(TMP_CONVERT, name)
        await asyncio.to_thread(os.rename, src, tmp)
        reasons: list[str] = []
        try:
            directory = await asyncio.to_thread(_check_detached, tmp, name, columns_text(r.spec.columns))
            reasons = await asyncio.to_thread(incompatibilities_with_18_16, directory)
            if reasons:  # a part of current ClickHouse: attached as the 18.16 Wide part with its rows
                log.info("attach_converting_part", table=str(r.spec.name), part=name, reasons=reasons)
                directory = await asyncio.to_thread(
                    _convert_detached, tmp, converted, name, r.schema, r.writer_settings)
            temp = TempPart(path=directory.path, partition_id=info.partition_id, rows=directory.rows,
                            checksums=directory.checksums, columns_text=directory.columns_text, block_id="")
            result = await r.committer.commit(temp)
        except BaseException:
            if converted.exists():
                await asyncio.to_thread(shutil.rmtree, converted, True)
            if tmp.exists():  # not committed: back where it was, under its name
                await asyncio.to_thread(os.rename, tmp, src)
            raise
        if reasons:  # the original of the converted part
            await asyncio.to_thread(shutil.rmtree, tmp, True)
        return result.part_name

    async def drop_detached(self, statement: Statement) -> ExecuteResult:
        cmd = self._detached_command(statement)
        names = await asyncio.to_thread(self._detached_names, cmd)
        await asyncio.to_thread(_remove_detached, self.replica.layout.detached_path, names)
        log.info("detached_parts_dropped", table=str(self.replica.spec.name), parts=names)
        return ExecuteResult(fields={"parts": names})

    # ---- replicas -----------------------------------------------------------------------------------------

    async def drop_replica(self, statement: Statement) -> ExecuteResult:
        r = self.replica
        if r.is_readonly:
            raise ReadOnlyError(f"Table {r.spec.name} is in readonly mode")
        name = getattr(statement.parsed, "replica", None)
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise BadInputError(f"Invalid replica name {name!r}", code=36)
        if name == r.paths.replica_name:
            raise BadInputError("We can't drop the local replica: use DROP TABLE to drop this replica and "
                                "its data", code=TABLE_WAS_NOT_DROPPED)
        them = r.paths.replica(name)
        if await r.keeper.exists(them.root) is None:
            raise BadInputError(f"Replica {name} does not exist in {r.paths.zk_path}",
                                code=TABLE_WAS_NOT_DROPPED)
        if await r.keeper.exists(them.is_active) is not None:
            raise BadInputError(f"Can't drop replica {name}, because it's active", code=TABLE_WAS_NOT_DROPPED)
        try:  # as ClickHouse: mark it lost first, so a replica that comes back clones instead of resuming
            await r.keeper.set(them.is_lost, b"1")
        except KeeperNoNodeError:
            pass
        await r.keeper.delete(them.root, recursive=True)
        if r.store.remote is not None:  # its zero-copy locks would keep shared objects forever
            await r.store.remote.release_replica(name)
        log.warning("replica_dropped", table=str(r.spec.name), replica=name)
        return ExecuteResult()

    async def restart_replica(self, statement: Statement, timeout_s: float = 60.0) -> ExecuteResult:
        r = self.replica
        r.restarting.request_restart("SYSTEM RESTART REPLICA")
        deadline = time.monotonic() + timeout_s
        await asyncio.sleep(0)
        while r.restarting.restart_requested or r.is_readonly:
            if time.monotonic() > deadline:
                raise ReplicadError(f"Replica of {r.spec.name} did not restart within {timeout_s:.0f}s: "
                                    f"{r.restarting.last_error or r.restarting.readonly_reason}", code=159,
                                    retriable=True)
            await asyncio.sleep(0.05)
        return ExecuteResult()

    async def stop_start(self, statement: Statement) -> ExecuteResult:
        action = getattr(statement.parsed, "action", "")
        stop = action.startswith("STOP")
        blockers = self.replica.blockers
        if statement.kind is StatementKind.FETCHES:
            blockers.fetches = stop
        else:
            blockers.merges = stop
        log.info("action_blocker", table=str(self.replica.spec.name), action=action)
        if not stop:
            self.replica.executor.wakeup()
            self.replica.ops.assigner.wakeup()
        return ExecuteResult()


def _check_detached(path: Path, name: str, table_columns_text: str) -> PartDirectory:
    directory = PartDirectory.at(path).preload()
    try:
        directory.verify(check_uncompressed=True)
    except UnsupportedPartFormatError as e:
        raise BadInputError(f"Detached part {name} cannot be read: {e}", code=40) from None
    except (CorruptedDataError, OSError) as e:
        raise BadInputError(f"Detached part {name} is broken: {e}", code=40) from None
    own = [(n, t) for n, t in directory.column_types if n not in SYSTEM_COLUMNS]  # _row_exists ...
    if columns_text(own) != table_columns_text:
        raise BadInputError(f"Detached part {name} has other columns than the table: its columns.txt is "
                            f"{directory.columns_text!r}", code=INCOMPATIBLE_COLUMNS)
    return directory


def _convert_detached(source: Path, out: Path, name: str, schema: TableSchemaLike,
                      settings: WriterSettings) -> PartDirectory:
    """Rewrite a part written by current ClickHouse (Compact, size streams, sparse, codecs ...) as the
    18.16 Wide part with the same rows; the source is left as it is."""
    try:
        rewrite_part(source, out, schema, settings)
    except (UnsupportedPartFormatError, CorruptedDataError) as e:
        raise BadInputError(f"Detached part {name} cannot be read: {e}", code=40) from None
    return PartDirectory.at(out).preload()


def _remove_detached(detached: Path, names: list[str]) -> None:
    for name in names:
        src = detached / name
        doomed = detached / f"deleting_{name}"
        os.rename(src, doomed)  # out of sight at once, then removed
        shutil.rmtree(doomed)
