"""Committing a freshly written part (ReplicatedMergeTreeBlockOutputStream::commitPart of 18.16).

Sequence (FACTS §4.2), for one ``tmp_insert_`` part of partition ``P`` with deduplication id ``B``:

1. ``block_numbers/P`` exists (created with a ``set block_numbers`` version bump if not);
2. ``multi[create blocks/B; remove blocks/B; check temp/abandonable_lock-insert; create
   block_numbers/P/block-]`` (:mod:`replicad.keeper.block_lock`, ClickHouse 22.11+'s one-round-trip lock;
   18.16 takes two) — ZNODEEXISTS on ``blocks/B``: duplicate; else block number ``N``; the part is named
   ``P_N_N_0`` and renamed to it (pre-committed: peers may fetch it as soon as the log entry is visible);
3. one multi: ``create blocks/B = <part>``; ``check columns v``; ``create replicas/<me>/parts/<part>`` and its
   ``columns`` / ``checksums`` children; ``create log/log- <GET_PART>``; ``remove`` the lock's node.

Two ZooKeeper round trips in all, where 18.16 needs three.

With ``insert_quorum`` the multi also creates ``quorum/status`` and checks our ``is_active``/``host`` versions
(:mod:`replicad.replication.quorum`); the insert returns once the quorum is reached.

Outcome: OK → the part becomes active.  ZNODEEXISTS on ``blocks/B`` → another insert of the same block won
the race: the part is deleted and the block counts as deduplicated.  Connection loss / operation timeout →
we cannot know: the part is kept active, a part check is scheduled, UnknownInsertStatusError is raised.
Anything else → the part is deleted and the error raised.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicad import stage_times
from replicad.errors import (
    KeeperBadVersionError,
    KeeperConnectionLossError,
    KeeperError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperOperationTimeoutError,
    KeeperSessionExpiredError,
    QuorumError,
    ReplicadError,
    UnknownInsertStatusError,
)
from replicad.keeper.block_lock import BlockNumberAllocator, BlockNumberLock, SentLock
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Create, Op
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry
from replicad.model.part_info import PartInfo
from replicad.replication.part_store import PartStore
from replicad.replication.quorum import (
    QuorumPrecondition,
    quorum_commit_ops,
    wait_for_existing_quorum,
    wait_for_quorum,
)
from replicad.storage.checksums import Checksums
from replicad.storage.fresh_files import PartFiles

if TYPE_CHECKING:
    from replicad.replication.early_lock import EarlyLock

log = get_logger(__name__)


class ColumnsVersionChangedError(ReplicadError):
    """The table's ``columns`` changed (an ALTER) between writing a part and committing it."""

    code = 244  # 18.16 answers UNEXPECTED_ZOOKEEPER_ERROR here
    retriable = True


@dataclass(frozen=True)
class TempPart:
    """A written, not yet committed part (``tmp_insert_<...>``)."""

    path: Path
    partition_id: str
    rows: int
    checksums: Checksums
    columns_text: str
    block_id: str  # "" = no deduplication
    #: the writer's sum of its files' sizes (None: not known, as for a part taken from a directory)
    bytes_on_disk: int | None = None
    #: the block-number lock taken while the part was written (:mod:`replicad.replication.early_lock`);
    #: when its ``renamed`` is set, the part is there, no longer at ``path``
    early: EarlyLock | None = field(default=None, compare=False)
    #: every file of the part as its writer held them (small parts written whole), for the replicas that
    #: fetch it (replicad.storage.fresh_files); () otherwise
    files: PartFiles = field(default=(), compare=False, repr=False)

    @property
    def where(self) -> Path:
        """The part's directory now: ``path``, or the part's name if the writer's thread renamed it."""
        renamed = self.early.renamed if self.early is not None else None
        return renamed if renamed is not None else self.path


@dataclass(frozen=True)
class CommitResult:
    part_name: str  # "" when deduplicated
    deduplicated: bool
    block_number: int = -1


def part_commit_ops(
    paths: TablePaths, part_name: str, columns_text: str, checksums: Checksums, columns_version: int
) -> list[Op]:
    """``check columns`` + ``replicas/<me>/parts/<part>`` with its ``columns``/``checksums`` children."""
    me = paths.me
    return [
        Check(paths.columns, columns_version),
        Create(me.part(part_name), b""),
        Create(me.part_columns(part_name), columns_text.encode()),
        Create(me.part_checksums(part_name), checksums.minimalistic_text()),
    ]


class PartCommitter:
    """Commits inserted parts of one table."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        *,
        columns_version: Callable[[], int],
        tz: str = "UTC",
        enqueue_part_check: Callable[[str], None] | None = None,
        on_committed: Callable[[str, LogEntry, bytes], None] | None = None,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.allocator = BlockNumberAllocator(paths)
        self._columns_version = columns_version
        self.tz = tz
        self._enqueue_part_check = enqueue_part_check
        #: told the ``log-`` node, entry and bytes of each part's commit once its multi succeeded
        #: (replicad.replication.own_inserts)
        self.on_committed = on_committed

    def early_lock(self, *, deduplicate: bool, token: str | None, ordinal: int) -> EarlyLock:
        """A lock for the next insert block's first part, taken while it is written (pass it to
        :func:`replicad.replication.sink.write_block`; ``ordinal``: that part's in the INSERT)."""
        from replicad.replication.early_lock import EarlyLock

        def send(partition_id: str, block_id: str) -> SentLock | None:
            return self.allocator.send(self.keeper, partition_id, block_id or None)

        def take(partition_id: str, block_id: str,
                 sent: SentLock | None) -> Coroutine[Any, Any, BlockNumberLock | None]:
            return self.allocator.allocate(self.keeper, partition_id, block_id or None, sent=sent)

        return EarlyLock(asyncio.get_running_loop(), self.keeper, send, take, deduplicate=deduplicate,
                         token=token, ordinal=ordinal, known=self.store.knows,
                         layout=self.store.layout if self.store.remote is None else None)

    async def commit(
        self,
        part: TempPart,
        quorum: QuorumPrecondition | None = None,
        quorum_timeout_s: float = 600.0,
        *,
        markers: Sequence[str] = (),
    ) -> CommitResult:
        """Commit one part.  With ``quorum`` the multi also creates ``quorum/status`` and the call returns
        once the quorum is reached (UnknownInsertStatusError on timeout).  ``markers``: nodes the multi also
        creates (a staged part's "published" marker); one that exists already makes the part a duplicate."""
        block_id = part.block_id
        try:
            if part.early is not None:  # taken while the part was written, with the same block id
                lock = await part.early.lock()
            else:
                lock = await self.allocator.allocate(self.keeper, part.partition_id, block_id or None)
        except BaseException:  # no block number (ZooKeeper gone, …): the written part must not stay behind
            await _remove_tmp(part.where)
            raise
        if lock is None:
            log.info("block_deduplicated", block_id=block_id, stage="precheck")
            await _remove_tmp(part.where)
            if quorum is not None:
                await wait_for_existing_quorum(self.keeper, self.paths, block_id, quorum_timeout_s)
            return CommitResult("", True)

        info = PartInfo.for_insert(part.partition_id, lock.number)
        name = info.name
        entry = LogEntry.get_part(
            name,
            source_replica=self.paths.replica_name,
            block_id=block_id,
            create_time=int(time.time()),
            quorum=quorum.quorum if quorum is not None else 0,
        )
        ops: list[Op] = []
        if block_id:
            ops.append(Create(self.paths.block(block_id), name.encode()))
        ops += part_commit_ops(self.paths, name, part.columns_text, part.checksums, self._columns_version())
        log_op, entry_bytes = len(ops), entry.to_bytes(self.tz)
        ops.append(Create(self.paths.log_prefix, entry_bytes, sequence=True))
        ops += [Create(m, b"") for m in markers]
        ops += lock.unlock_ops()
        if quorum is not None:
            ops += quorum_commit_ops(self.paths, name, quorum)

        try:
            stage_times.mark("commit_ops")
            await self.store.precommit(part.path, info,
                                     (part.checksums, part.columns_text, part.rows, part.bytes_on_disk),
                                     renamed=part.early.renamed if part.early is not None else None,
                                     files=part.files)
        except BaseException:
            await _release_quietly(self.keeper, lock.unlock_ops())
            await _remove_tmp(part.where)
            raise
        ops += self.store.commit_ops(name)  # the zero-copy lock, in the same multi (S3 disks)

        try:
            stage_times.mark("rename")
            # our own log entry's watch notification comes before the answer: the log puller's reaction
            # waits until the insert has its answer (replicad.keeper.session.SessionTracker.holding_watches)
            with self.keeper.holding_watches():
                results = await self.keeper.multi(ops)
            stage_times.mark("zk_commit_multi")
        except KeeperMultiError as e:
            await self.store.rollback(name)
            failed_path = ops[e.index].path if 0 <= e.index < len(ops) else ""
            await _release_quietly(self.keeper, lock.unlock_ops())
            if isinstance(e.cause, KeeperNodeExistsError) and (
                (block_id and failed_path == self.paths.block(block_id)) or failed_path in markers
            ):
                log.info("block_deduplicated", block_id=block_id, part=name, stage="commit")
                if quorum is not None and block_id:
                    await wait_for_existing_quorum(self.keeper, self.paths, block_id, quorum_timeout_s)
                return CommitResult("", True, lock.number)
            if isinstance(e.cause, KeeperBadVersionError) and failed_path == self.paths.columns:
                raise ColumnsVersionChangedError(
                    f"Table structure changed (ALTER) while adding block {lock.number}: retry") from e
            if isinstance(e.cause, KeeperNodeExistsError) and failed_path == self.paths.quorum_status:
                raise QuorumError("Another quorum insert has been already started", code=286) from e
            raise ReplicadError(
                f"Unexpected logical error while adding block {lock.number} with ID '{block_id}': "
                f"{e.cause}, path {failed_path}",
                code=244,
            ) from e
        except (KeeperConnectionLossError, KeeperOperationTimeoutError, KeeperSessionExpiredError) as e:
            # The transaction may or may not have been applied: keep the part, let the part check decide.
            # Releasing the lock is harmless either way (already gone if the multi was applied; if not, the
            # block number is abandoned instead of looking "committing" until our session ends).
            await _release_quietly(self.keeper, lock.unlock_ops())
            self.store.activate(name, registered=False)
            if self._enqueue_part_check is not None:
                self._enqueue_part_check(name)
            raise UnknownInsertStatusError(f"Unknown status, client must retry. Reason: {e}") from e
        except BaseException:
            await self.store.rollback(name)
            raise

        self.store.activate(name)
        # logged once the task lets go of the loop (an insert's answer is written first): the line's
        # rendering and write were ~1 % of an inserting daemon's loop time, inside the acknowledgement
        asyncio.get_running_loop().call_soon(functools.partial(
            log.info, "part_committed", part=name, rows=part.rows, block_id=block_id))
        if self.on_committed is not None:
            self.on_committed(basename(str(results[log_op])), entry, entry_bytes)
        stage_times.mark("activate")
        if quorum is not None:
            await wait_for_quorum(self.keeper, self.paths, name, quorum, quorum_timeout_s)
            stage_times.mark("zk_quorum_wait")
        return CommitResult(name, False, lock.number)


async def _release_quietly(keeper: Keeper, ops: list[Op]) -> None:
    try:
        await keeper.multi(ops)
    except KeeperError:
        pass  # ephemeral nodes: they disappear with the session anyway


async def _remove_tmp(path: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, path, True)
