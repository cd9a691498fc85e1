"""checkPartChecksumsAndCommit's comparison: a part made here (fetched, merged, attached) against what every
replica registered for it in ZooKeeper (``parts/<part>/columns`` + ``checksums``, or a single-node part
header).  Checksums are compared only between registrations of the same columns, as ClickHouse does.

A fetched part is compared with its source's registration only (:func:`compare_with_source`), where 18.16
reads every replica's: its bytes came from a replica that had registered the part, so they are checked
against a replica that has it, and every registration of the part is consistent with the others by
induction (a part made here, merged or attached, is still compared with every replica, with the commit's
probes for those without it, so two replicas making the same part meanwhile meet in one of the two
commits).  Reading every replica made each fetching replica's requests grow with the replica count, and
the whole set's with its square.  When the source's registration cannot be compared (gone meanwhile, other
columns, changed between the reads) every replica is read, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

from replicad.errors import (
    KeeperBadVersionError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Delete, Op, ZnodeStat
from replicad.keeper.paths import ReplicaPaths, TablePaths
from replicad.logging import get_logger
from replicad.model.siphash import SipHash
from replicad.replication.commit import part_commit_ops
from replicad.storage.checksums import Checksums, MinimalisticChecksums, PartHeader

log = get_logger(__name__)


@dataclass(frozen=True)
class ReplicaState:
    """What the fetcher's ``_read_replica_state`` read: per replica its ``parts/<part>/columns`` node and the
    answers of the second round (see there), and the table's ``columns`` version.  ``self_read``: our own
    registration was read too (else it was not, and counts as absent: the commit's create of our part node
    proves that).  ``source_only``: only a fetched part's source was read (:func:`compare_with_source`)."""

    replicas: tuple[ReplicaPaths, ...]
    columns: tuple[tuple[bytes, ZnodeStat] | None, ...]
    answers: tuple[object, ...]
    columns_version: int
    self_read: bool = True
    source_only: bool = False


def compare_with_replicas(
    seen: ReplicaState, part_name: str, columns_text: str, checksums: Checksums
) -> set[str]:
    """Check ``checksums`` against the replicas that registered the part (CorruptedDataError on a
    mismatch); returns the part paths of the replicas without it."""
    return {rp.part(part_name) for rp, outcome in _compare(seen, part_name, columns_text, checksums)
            if outcome is _ABSENT}


def compare_with_source(seen: ReplicaState, part_name: str, columns_text: str, checksums: Checksums) -> bool:
    """Check ``checksums`` against the registrations in ``seen`` (the source's, read by
    :func:`read_registrations`; CorruptedDataError on a mismatch); False when none of them could be compared
    (absent, other columns, changed between the reads): the caller then compares with every replica."""
    return any(outcome is _COMPARED for _, outcome in _compare(seen, part_name, columns_text, checksums))


_ABSENT, _COMPARED, _SKIPPED = object(), object(), object()


def _compare(
    seen: ReplicaState, part_name: str, columns_text: str, checksums: Checksums
) -> list[tuple[ReplicaPaths, object]]:
    """Each replica of ``seen`` with what its registration was: absent, compared (equal: a mismatch raises
    CorruptedDataError) or skipped (other columns, or changed between the reads)."""
    mine = MinimalisticChecksums.from_checksums(checksums)
    answers = iter(seen.answers)
    columns_hash = SipHash().update(columns_text.encode()).digest128()
    out: list[tuple[ReplicaPaths, object]] = []
    for rp, col in zip(seen.replicas, seen.columns, strict=True):
        if col is None:
            node = cast("tuple[bytes, ZnodeStat] | None", next(answers))
            if node is None:
                out.append((rp, _ABSENT))
            elif node[0].startswith(b"part header format version:"):
                header = PartHeader.parse(node[0])
                if header.columns_hash == columns_hash:
                    header.checksums.check_equal(mine, True)
                    out.append((rp, _COMPARED))
                else:
                    out.append((rp, _SKIPPED))
            else:
                out.append((rp, _SKIPPED))
            continue
        raw = cast("tuple[bytes, ZnodeStat] | None", next(answers))
        after = cast("ZnodeStat | None", next(answers))
        theirs_columns, stat_before = col
        if theirs_columns.decode() != columns_text:
            log.info("not_checking_checksums_columns_differ", part=part_name, replica=rp.name)
            out.append((rp, _SKIPPED))
            continue
        if raw is None or after is None or after.version != stat_before.version:
            out.append((rp, _SKIPPED))
            continue
        MinimalisticChecksums.parse(raw[0]).check_equal(mine, True)
        out.append((rp, _COMPARED))
    return out


async def read_registrations(
    keeper: Keeper,
    paths: TablePaths,
    part_name: str,
    names: list[str],
    columns_version: int,
    include_self: bool,
    *,
    source_only: bool = False,
) -> ReplicaState:
    """What the replicas ``names`` (plus or minus ourselves: ``include_self``) registered for the part, in two
    pipelined rounds: every replica's ``columns`` child; then, where it exists, the ``checksums`` child,
    elsewhere the part node (absent, or a single-node header).

    18.16 reads the ``columns`` version a third time after the checksums (unchanged = a consistent pair).
    That read is made only for a replica whose checksums node was written after the columns read (a newer
    ``mzxid``): otherwise the checksums read were already the value when the columns were read (our
    session's reads see ZooKeeper's states in order), so the pair is consistent as it is, and the answers
    carry the columns' own stat as the "after" stat (one request less per replica holding the part)."""
    me = paths.replica_name
    if include_self and me not in names:  # checked: absent tells whether we registered it
        names = [*names, me]
    elif not include_self:
        names = [n for n in names if n != me]
    rps = [paths.replica(r) for r in names]
    columns = await keeper.get_many([rp.part_columns(part_name) for rp in rps])
    second = await asyncio.gather(*(
        _get_or_none(keeper, rp.part(part_name) if col is None else rp.part_checksums(part_name))
        for rp, col in zip(rps, columns, strict=True)))
    newer = [i for i, (col, raw) in enumerate(zip(columns, second, strict=True))
             if col is not None and raw is not None and raw[1].mzxid > col[1].mzxid]
    again: dict[int, ZnodeStat | None] = {}
    if newer:
        stats = await asyncio.gather(*(keeper.exists(rps[i].part_columns(part_name)) for i in newer))
        again = dict(zip(newer, stats, strict=True))
    answers: list[object] = []
    for i, (col, raw) in enumerate(zip(columns, second, strict=True)):
        answers.append(raw)
        if col is not None:
            answers.append(again[i] if i in again else col[1])
    return ReplicaState(tuple(rps), tuple(columns), tuple(answers), columns_version, include_self,
                        source_only)


async def recheck_absent(
    keeper: Keeper,
    paths: TablePaths,
    part_name: str,
    absent: set[str],
    columns_version: int,
    columns_text: str,
    checksums: Checksums,
) -> set[str]:
    """After a commit's probe failed (a replica registered the part meanwhile): read and check again only the
    replicas whose part paths are in ``absent`` (the registrations checked before stay checked, as of their
    reading); returns those still without the part.  With several replicas fetching a new part at once their
    commits meet like this all the time, and reading every replica again made each one's cost grow with the
    square of the replica count."""
    names = sorted({path.rsplit("/parts/", 1)[0].rsplit("/", 1)[-1] for path in absent})
    seen = await read_registrations(keeper, paths, part_name, names, columns_version, include_self=True)
    return compare_with_replicas(seen, part_name, columns_text, checksums)


async def _get_or_none(keeper: Keeper, path: str) -> tuple[bytes, ZnodeStat] | None:
    try:
        return await keeper.get(path)
    except KeeperNoNodeError:
        return None


async def commit_registration(
    keeper: Keeper,
    paths: TablePaths,
    part_name: str,
    columns_text: str,
    checksums: Checksums,
    *,
    read_state: Callable[[bool], Awaitable[ReplicaState]],
    extra_ops: Callable[[], Sequence[Op]] = lambda: (),
    optional_ops: Callable[[], Sequence[Op]] | None = None,
    absent: set[str] | None = None,
    columns_version: int | None = None,
    self_read: bool = True,
) -> bool:
    """Register a part made here under ``replicas/<me>/parts`` after comparing it with the replicas'
    registrations (``read_state(fresh_columns_version)`` reads them); ``absent`` / ``columns_version``: from
    a check just made (used by the first attempt); ``self_read``: whether that check read our own
    registration (if not and it exists, the multi's create of it fails and everything is read again, ours
    included).  Every replica without the part is probed in the multi (create + delete), so one that
    registers it meanwhile makes the multi fail and is compared.  A multi refused by its ``check columns``
    (the version known is not current) is tried again with the version read from ZooKeeper.  ``extra_ops()``:
    more of the same multi (a zero-copy lock); ``optional_ops()``: more still, left out of a new try when
    one of them fails (the queue entry's removal).  Returns whether the optional ops were applied (False as
    well when our node was there already: nothing was written)."""
    me = paths.me
    fresh_columns_version = False
    recheck: set[str] = set()  # the part paths probed when a probe failed: only those are read again
    for _attempt in range(10):
        if recheck and columns_version is not None:  # ours among them: self_read
            absent = await recheck_absent(
                keeper, paths, part_name, recheck, columns_version, columns_text, checksums)
            recheck, self_read = set(), True
        elif absent is None or columns_version is None:
            seen = await read_state(fresh_columns_version)
            absent = compare_with_replicas(seen, part_name, columns_text, checksums)
            columns_version = seen.columns_version
            self_read = True
        missing, absent = absent, None
        if me.part(part_name) not in missing:  # our own node is there already
            log.warning("part_node_already_exists", part=part_name)
            return False
        probes: list[Op] = []
        for path in sorted(missing):
            if path == me.part(part_name):
                continue
            probes += [Create(path, b""), Delete(path)]
        ops = probes + part_commit_ops(paths, part_name, columns_text, checksums, columns_version)
        ops += extra_ops()
        first_optional = len(ops)
        if optional_ops is not None:
            ops += optional_ops()
        try:
            await keeper.multi(ops)
            return optional_ops is not None
        except KeeperMultiError as e:
            failed = ops[e.index].path if 0 <= e.index < len(ops) else ""
            if optional_ops is not None and e.index >= first_optional:
                log.info("part_committed_without_optional_ops", part=part_name, path=failed,
                         error=str(e.cause))
                optional_ops, absent = None, missing
                continue
            if e.index < len(probes) and isinstance(e.cause, KeeperNodeExistsError):
                log.info("part_appeared_on_replica_rechecking", part=part_name, path=failed)
                recheck = missing
                continue
            exists = isinstance(e.cause, KeeperNodeExistsError)
            if not self_read and failed == me.part(part_name) and exists:
                log.info("part_node_exists_rechecking", part=part_name)
                continue
            if failed == paths.columns and isinstance(e.cause, KeeperBadVersionError):
                if fresh_columns_version:
                    raise
                log.info("columns_version_changed_rechecking", part=part_name, version=columns_version)
                fresh_columns_version = True
                columns_version = None
                continue
            raise
    raise ReplicadError(
        f"Could not commit fetched part {part_name}: replicas keep changing", retriable=True
    )
