"""Creating / joining a replicated table in ZooKeeper, exactly as ClickHouse 18.16 does it.

* ``create_table_if_not_exists``: one multi creating ``<zk>``, ``metadata``, ``columns``, ``log``, ``blocks``,
  ``block_numbers``, ``nonincrement_block_numbers``, ``leader_election``, ``temp``, ``replicas``.
* ``check_table_structure``: the table's ``metadata``/``columns`` must describe the same table as our DDL
  (MetadataMismatchError otherwise); remembers the znode versions (the commit multi checks ``columns``).
* ``create_replica``: one multi creating ``replicas/<me>`` and its children, with ``is_lost`` = "0" for the
  first replica and "1" otherwise, and ``set replicas = "last added replica: <me>"`` guarded by its version.
* ``create_new_nodes``: ``quorum``…, ``min_unprocessed_insert_time``, ``mutations``, ``mutation_pointer``,
  ``replicas/<me>/metadata`` (create-if-missing, not atomic, like 18.16's createNewZooKeeperNodes).
* ``activate_replica``: multi[create ``is_active`` EPHEMERAL ``pid: N, random: M``; set ``host``]; refused
  with ReplicaIsAlreadyActiveError while another session holds ``is_active``.

Cloning a lost replica (``is_lost`` = "1") is :mod:`replicad.replication.clone`'s job.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass

from replicad.errors import (
    KeeperBadVersionError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    MetadataMismatchError,
    ReplicadError,
    ZnodeFormatError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Op, Set
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.address import ActiveMarker
from replicad.sql.table_metadata import ColumnsDescription, TableMetadata

log = get_logger(__name__)


class ReplicaIsAlreadyActiveError(ReplicadError):
    code = 224  # REPLICA_IS_ALREADY_ACTIVE
    retriable = True


#: (local text, text in ZooKeeper) -> list of human-readable differences (empty = same table)
MetadataComparer = Callable[[str, str], list[str]]


@dataclass(frozen=True)
class TableStructure:
    """The table-level znodes as read when we checked our DDL against them."""

    metadata_text: str
    metadata_version: int
    columns_text: str
    columns_version: int


def active_node_identifier() -> str:
    """What 18.16 writes into ``is_active``: ``pid: <pid>, random: <UInt64>``."""
    return ActiveMarker.for_process(os.getpid(), random.getrandbits(64)).to_text()


# ---------------------------------------------------------------------------------------------- creation


async def create_table_if_not_exists(
    keeper: Keeper, paths: TablePaths, metadata_text: str, columns_text: str
) -> bool:
    """Create the table's nodes in one multi; False if the table already existed."""
    if await keeper.exists(paths.zk_path) is not None:
        return False
    parent = paths.zk_path.rsplit("/", 1)[0]
    if parent:
        await keeper.ensure_path(parent)
    ops: list[Op] = [
        Create(paths.zk_path, b""),
        Create(paths.metadata, metadata_text.encode()),
        Create(paths.columns, columns_text.encode()),
        Create(paths.log, b""),
        Create(paths.blocks, b""),
        Create(paths.block_numbers, b""),
        Create(paths.nonincrement_block_numbers, b""),
        Create(paths.leader_election, b""),
        Create(paths.temp, b""),
        Create(paths.replicas, b""),
    ]
    try:
        await keeper.multi(ops)
    except KeeperMultiError as e:
        if isinstance(e.cause, KeeperNodeExistsError):
            return False  # somebody created it at the same moment
        raise
    log.info("table_created_in_zookeeper", zk_path=paths.zk_path)
    return True


def default_metadata_comparer(local: str, zk: str) -> list[str]:
    """ClickHouse's metadata check: key expressions compared after re-formatting, the rest literally."""
    try:
        return [d.message() for d in TableMetadata.parse(local).differences(TableMetadata.parse(zk))]
    except ZnodeFormatError as e:
        return [f"cannot parse table metadata: {e}"]


def default_columns_comparer(local: str, zk: str) -> list[str]:
    """Columns must match one by one: name, type, default, comment (modern-only extras are ignored)."""
    try:
        mine, theirs = ColumnsDescription.parse(local).ordered(), ColumnsDescription.parse(zk).ordered()
    except ZnodeFormatError as e:
        return [f"cannot parse columns: {e}"]
    if [c.name for c in mine] != [c.name for c in theirs]:
        return [f"columns {[c.name for c in theirs]} in ZooKeeper, {[c.name for c in mine]} locally"]
    out = []
    for a, b in zip(mine, theirs, strict=True):
        ka = (a.type, a.default_kind, a.default_expression, a.comment)
        kb = (b.type, b.default_kind, b.default_expression, b.comment)
        if ka != kb:
            out.append(
                f"column {a.name}: {b.to_line().strip()!r} in ZooKeeper, {a.to_line().strip()!r} locally"
            )
    return out


async def check_table_structure(
    keeper: Keeper,
    paths: TablePaths,
    metadata_text: str,
    columns_text: str,
    compare_metadata: MetadataComparer = default_metadata_comparer,
    compare_columns: MetadataComparer = default_columns_comparer,
) -> TableStructure:
    zk_metadata_raw, metadata_stat = await keeper.get(paths.metadata)
    zk_columns_raw, columns_stat = await keeper.get(paths.columns)
    zk_metadata, zk_columns = zk_metadata_raw.decode(), zk_columns_raw.decode()
    problems = compare_metadata(metadata_text, zk_metadata)
    problems += [f"columns: {d}" for d in compare_columns(columns_text, zk_columns)]
    if problems:
        raise MetadataMismatchError(
            f"Table structure in ZooKeeper ({paths.zk_path}) differs from the local table definition: "
            + "; ".join(problems)
        )
    return TableStructure(zk_metadata, metadata_stat.version, zk_columns, columns_stat.version)


async def replica_exists(keeper: Keeper, paths: TablePaths) -> bool:
    return await keeper.exists(paths.me.root) is not None


async def create_replica(keeper: Keeper, paths: TablePaths, columns_text: str) -> None:
    """18.16's createReplica (retried while other replicas are being added concurrently)."""
    me = paths.me
    while True:
        last_added, replicas_stat = await keeper.get(paths.replicas)
        is_lost = b"0" if not last_added else b"1"
        ops: list[Op] = [
            Create(me.root, b""),
            Create(me.host, b""),
            Create(me.log_pointer, b""),
            Create(me.queue, b""),
            Create(me.parts, b""),
            Create(me.flags, b""),
            Create(me.is_lost, is_lost),
            Create(me.columns, columns_text.encode()),
            Set(paths.replicas, f"last added replica: {paths.replica_name}".encode(), replicas_stat.version),
        ]
        try:
            await keeper.multi(ops)
        except KeeperMultiError as e:
            if isinstance(e.cause, KeeperBadVersionError):
                log.warning("create_replica_retry", replica=paths.replica_name)
                continue
            if isinstance(e.cause, KeeperNodeExistsError):
                raise ReplicadError(f"Replica {me.root} already exists.", code=253) from e
            raise
        log.info("replica_created", replica_path=me.root, is_lost=is_lost.decode())
        return


async def _create_if_not_exists(keeper: Keeper, path: str, data: bytes = b"") -> None:
    try:
        await keeper.create(path, data)
    except KeeperNodeExistsError:
        pass


async def create_new_nodes(keeper: Keeper, paths: TablePaths, metadata_text: str) -> None:
    """Nodes added after the first replicated releases (createNewZooKeeperNodes), plus our metadata copy."""
    me = paths.me
    for path in (
        paths.quorum,
        paths.quorum_last_part,
        paths.quorum_failed_parts,
        me.min_unprocessed_insert_time,
        me.max_processed_insert_time,
        paths.mutations,
        me.mutation_pointer,
        me.metadata,
    ):
        await _create_if_not_exists(keeper, path)
    data, _stat = await keeper.get(me.metadata)
    if data.decode() != metadata_text:
        await keeper.set(me.metadata, metadata_text.encode())


# ---------------------------------------------------------------------------------------------- activation


async def activate_replica(keeper: Keeper, paths: TablePaths, host_text: str, identifier: str) -> None:
    """Declare this replica active and publish its address (one multi, like 18.16)."""
    me = paths.me
    try:
        data, stat = await keeper.get(me.is_active)
    except KeeperNoNodeError:
        pass
    else:
        if data.decode() == identifier:  # our own node from a session that is expiring: replace it
            try:
                await keeper.delete(me.is_active, stat.version)
            except KeeperNoNodeError:
                pass
        elif stat.ephemeral_owner != 0 and stat.ephemeral_owner == keeper.session_id:
            await keeper.delete(me.is_active, stat.version)
    ops: list[Op] = [
        Create(me.is_active, identifier.encode(), ephemeral=True),
        Set(me.host, host_text.encode()),
    ]
    try:
        await keeper.multi(ops)
    except KeeperMultiError as e:
        if isinstance(e.cause, KeeperNodeExistsError):
            holder = ""
            try:
                holder = (await keeper.get(me.is_active))[0].decode()
            except KeeperNoNodeError:
                pass
            raise ReplicaIsAlreadyActiveError(
                f"Replica {me.root} appears to be already active ({holder}). If you're sure it's not, "
                f"try again in a minute or remove znode {me.is_active} manually"
            ) from e
        raise
    log.info("replica_activated", replica_path=me.root)
