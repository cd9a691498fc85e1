"""executeFetch / fetchPart: download a part from another replica over DataPartsExchange and commit it.

Source choice: among the *active* replicas (``is_active`` exists) other than us that hold the part or a part
covering it in ``replicas/<r>/parts``, the largest covering part wins; ties are broken by the largest
``log_pointer`` (the replica that has executed most of the log) and then the shortest ``queue``.  A replica
that failed to deliver the part recently (truncated or corrupt body, HTTP error) is tried last.

Download: ``POST http://<host>:<port>/?endpoint=DataPartsExchange:<zk>/replicas/<src>&part=<name>
&client_protocol_version=N&compress=false`` (Basic auth when configured); the ``server_protocol_version``
cookie (absent = 0, as from 18.16) selects the body layout.  The body is streamed into ``tmp-fetch_<name>``
(a stale directory of that name is removed first) by :func:`replicad.storage.part_transfer.receive_part`,
which checks every file hash, EOF and the received checksums.txt.  Then, as 18.16's
``checkPartChecksumsAndCommit``: every replica that has ``parts/<name>`` with the same columns text must have
the same minimalistic checksums (uncompressed hashes of compressed files included); the directory is
renamed to the part's name; one multi creates ``replicas/<me>/parts/<name>`` (+ ``columns``/``checksums``),
preceded by create+remove probes for the replicas that did not have the part (so a part appearing there
meanwhile is re-checked); the part becomes active and the parts it covers outdated.
"""

from __future__ import annotations

import asyncio
import base64
import random
import shutil
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

import aiohttp

from replicad.errors import (
    CorruptedDataError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Delete, Op, ZnodeStat
from replicad.keeper.paths import ReplicaPaths, TablePaths
from replicad.logging import get_logger
from replicad.model.address import ReplicaAddress
from replicad.model.checksums import Checksums, MinimalisticChecksums, PartHeader
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.siphash import SipHash
from replicad.replication.commit import part_commit_ops
from replicad.replication.part_store import LocalPart, PartStore
from replicad.storage.layout import TMP_FETCH
from replicad.storage.part import fsync_part_files
from replicad.storage.part_sink import PartSink
from replicad.storage.part_transfer import RECEIVE_MAX_PROTOCOL_VERSION, ReceivedPart, receive_part

log = get_logger(__name__)

T = TypeVar("T")

#: a replica that failed to deliver a part is tried last for this long
FAILED_SOURCE_PENALTY_S = 60.0
#: host and checksums read by find_source serve the fetch that follows for this long
DETAILS_TTL_S = 10.0
#: source checks started as entries are pulled (beyond that, or for a bigger batch, none are started)
MAX_PRECHECKS = 16


class NoReplicaHasPartError(ReplicadError):
    code = 234  # NO_REPLICA_HAS_PART
    retriable = True


class FetchError(ReplicadError):
    """The source answered with an error status (429 too busy, 401, 500 …) or the connection failed."""

    code = 1000
    retriable = True


@dataclass(frozen=True)
class FetchSource:
    replica: str
    part_name: str  # the part to download: the entry's part or a part covering it
    log_pointer: int
    queue_size: int


@dataclass(frozen=True)
class _SourceDetails:
    """A source replica's ``host`` and its checksums of a part, read by find_source for the fetch."""

    host: bytes
    checksums: MinimalisticChecksums | None
    read_at: float


@dataclass(frozen=True)
class _ReplicaState:
    """What :meth:`PartFetcher._read_replica_state` read: per replica its ``parts/<part>/columns`` node and
    the answers of the second round (see there), and the table's ``columns`` version."""

    replicas: tuple[ReplicaPaths, ...]
    columns: tuple[tuple[bytes, ZnodeStat] | None, ...]
    answers: tuple[object, ...]
    columns_version: int


@dataclass(frozen=True)
class FetchCredentials:
    user: str | None = None
    password: str | None = None

    def headers(self) -> dict[str, str]:
        """``Authorization: Basic …`` when a user is configured (what 18.16 sends: its own credentials)."""
        if not self.user:
            return {}
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode("ascii")
        return {"Authorization": f"Basic {token}"}


class PartFetcher:
    """Fetches parts of one table from its peers."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        *,
        table_columns_text: str,
        columns_version: int | None = None,
        credentials: FetchCredentials | None = None,
        timeout_s: float = 1800.0,
        connect_timeout_s: float = 10.0,
        fsync: bool = False,
        min_bytes_to_fsync: int = 0,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.table_columns_text = table_columns_text
        self.columns_version = columns_version
        self.credentials = credentials or FetchCredentials()
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s, sock_read=300)
        #: fsync every fetched part (``fsync``), or those of at least ``min_bytes_to_fsync`` bytes
        #: (``min_compressed_bytes_to_fsync_after_fetch``; 0 = never, ClickHouse's default)
        self.fsync = fsync
        self.min_bytes_to_fsync = min_bytes_to_fsync
        self._session: aiohttp.ClientSession | None = None
        self._fetching: set[str] = set()
        #: (part, replica) -> when fetching that part from that replica last failed
        self._failed_sources: dict[tuple[str, str], float] = {}
        #: (part, replica) -> host and checksums read by find_source (used by the fetch that follows)
        self._details: dict[tuple[str, str], _SourceDetails] = {}
        #: (part, replica) -> check of a GET_PART's source started as the entry was pulled, and when
        self._prechecks: dict[tuple[str, str], tuple[asyncio.Task[bool], float]] = {}
        self.fetches_total = 0

    async def close(self) -> None:
        for task, _ in self._prechecks.values():
            task.cancel()
        self._prechecks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # read_bufsize: up to 2 MiB buffered before the socket stops being read (64 KiB by default)
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar(), read_bufsize=1 << 20
            )
        return self._session

    # ------------------------------------------------------------------------------------- source choice

    async def find_source(
        self, part_name: str, *, active: bool = True, hint: str | None = None
    ) -> FetchSource | None:
        """The best replica holding ``part_name`` or a part covering it (None: nobody).

        Replicas holding the exact part are found with one ``exists`` each; only when none has it are the
        replicas' part lists read to look for a covering part.  ``hint``: the replica that most likely has
        the part (a GET_PART entry's source replica); it is checked first, in one round with its host and
        its checksums of the part, and taken when it is active and has the part."""
        target = PartInfo.parse(part_name)
        me = self.paths.replica_name
        if hint and hint != me and not self._recently_failed(part_name, hint):
            early = self._prechecks.pop((part_name, hint), None)
            if early is not None and active and time.monotonic() - early[1] < DETAILS_TTL_S:
                task = early[0]
            else:
                if early is not None:
                    early[0].cancel()
                task = asyncio.ensure_future(self._check_hint(part_name, hint, active))
            try:
                if await task:
                    return FetchSource(hint, part_name, 0, 0)
            except KeeperNoNodeError:
                pass
        replicas = [r for r in await self.keeper.get_children(self.paths.replicas) if r != me]
        random.shuffle(replicas)
        # is_active and parts/<part> of every replica in one pipelined round
        probes = [self.paths.replica(r).part(part_name) for r in replicas]
        if active:
            probes += [self.paths.replica(r).is_active for r in replicas]
        stats = await asyncio.gather(*(self.keeper.exists(p) for p in probes))
        exact, alive = stats[: len(replicas)], stats[len(replicas) :]
        if active:
            keep = [i for i, st in enumerate(alive) if st is not None]
            replicas, exact = [replicas[i] for i in keep], [exact[i] for i in keep]
        found = [(r, part_name) for r, st in zip(replicas, exact, strict=True) if st is not None]
        if not found:
            for replica in replicas:
                try:
                    parts = await self.keeper.get_children(self.paths.replica(replica).parts)
                except KeeperNoNodeError:
                    continue
                best: PartInfo | None = None
                for name in parts:
                    info = PartInfo.try_parse(name)
                    if info is None or not info.contains(target):
                        continue
                    if best is None or info.contains(best):
                        best = info
                if best is not None:
                    found.append((replica, best.name))
        if not found:
            return None
        if len(found) == 1:  # nothing to choose: no need to read the replica's progress
            return FetchSource(found[0][0], found[0][1], 0, 0)
        progress = await asyncio.gather(*(self._replica_progress(r) for r, _ in found))
        candidates = [FetchSource(r, p, ptr, q) for (r, p), (ptr, q) in zip(found, progress, strict=True)]

        now = time.monotonic()

        def rank(c: FetchSource) -> tuple[bool, int, int, int, int]:
            info = PartInfo.parse(c.part_name)
            failed = self._recently_failed(c.part_name, c.replica, now)
            return (not failed, info.max_block - info.min_block, info.level, c.log_pointer, -c.queue_size)

        return max(candidates, key=rank)

    def precheck_sources(self, entries: list[LogEntry]) -> None:
        """Start checking the source replicas of new GET_PART entries (called as they are read from the log,
        so that the check overlaps with copying them into the queue; find_source then uses the result)."""
        if len(entries) > MAX_PRECHECKS:
            return  # a backlog: entries are checked one by one as they run
        now = time.monotonic()
        for key, (task, started) in list(self._prechecks.items()):
            if now - started >= DETAILS_TTL_S:
                task.cancel()
                del self._prechecks[key]
        for e in entries:
            hint = e.source_replica
            if e.type is not LogEntryType.GET_PART or not hint or hint == self.paths.replica_name:
                continue
            if len(self._prechecks) >= MAX_PRECHECKS or (e.new_part_name, hint) in self._prechecks:
                continue
            task = asyncio.ensure_future(self._check_hint(e.new_part_name, hint, True))
            task.add_done_callback(_consume_error)
            self._prechecks[(e.new_part_name, hint)] = (task, now)

    async def _check_hint(self, part_name: str, hint: str, active: bool) -> bool:
        """Whether ``hint`` is active (or ``active`` is False) and has the part: one round that also reads its
        host and its checksums of the part, kept for the fetch that follows."""
        rp = self.paths.replica(hint)
        alive, has_part, host, expected = await asyncio.gather(
            self.keeper.exists(rp.is_active),
            self.keeper.exists(rp.part(part_name)),
            self._get_or_none(rp.host),
            self._zk_checksums(hint, part_name),
        )
        if has_part is None or host is None or (alive is None and active):
            return False
        if len(self._details) > 1000:
            self._details.clear()
        self._details[(part_name, hint)] = _SourceDetails(host[0], expected, time.monotonic())
        return True

    def _recently_failed(self, part_name: str, replica: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._failed_sources.get((part_name, replica), -1e18) > now - FAILED_SOURCE_PENALTY_S

    async def _replica_progress(self, replica: str) -> tuple[int, int]:
        rp = self.paths.replica(replica)
        node, stat = await asyncio.gather(self._get_or_none(rp.log_pointer), self.keeper.exists(rp.queue))
        raw = node[0].strip() if node is not None else b""
        pointer = int(raw) if raw.isdigit() else 0
        return pointer, (stat.num_children if stat is not None else 1 << 30)

    async def _get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return await self.keeper.get(path)
        except KeeperNoNodeError:
            return None

    # ------------------------------------------------------------------------------------- fetch + commit

    async def fetch_part(
        self, part_name: str, source_replica: str
    ) -> tuple[LocalPart, list[LocalPart]] | None:
        """Download ``part_name`` from ``source_replica``, verify and commit it.  Returns the new part and the
        parts it made obsolete, or None if the part is already being fetched."""
        if part_name in self._fetching:
            log.debug("part_already_fetching", part=part_name)
            return None
        self._fetching.add(part_name)
        try:
            result = await self._fetch(part_name, source_replica)
        except BaseException:
            self._failed_sources[(part_name, source_replica)] = time.monotonic()
            if len(self._failed_sources) > 10_000:
                self._failed_sources.clear()
            raise
        else:
            self._failed_sources.pop((part_name, source_replica), None)
            return result
        finally:
            self._fetching.discard(part_name)

    async def _fetch(self, part_name: str, source_replica: str) -> tuple[LocalPart, list[LocalPart]]:
        info = PartInfo.parse(part_name)
        src = self.paths.replica(source_replica)
        details = self._details.pop((part_name, source_replica), None)
        if details is None or time.monotonic() - details.read_at > DETAILS_TTL_S:
            (raw_host, _), expected = await asyncio.gather(
                self.keeper.get(src.host), self._zk_checksums(source_replica, part_name)
            )
        else:
            raw_host, expected = details.host, details.checksums
        address = ReplicaAddress.parse(raw_host)
        tmp_dir = self.store.layout.tmp_path(TMP_FETCH, part_name)
        if tmp_dir.exists():
            log.warning("removing_stale_fetch_dir", dir=str(tmp_dir))
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
        log.info(
            "fetching_part",
            part=part_name,
            source=source_replica,
            host=address.host,
            port=address.replication_port,
        )
        # What the other replicas registered is read while the part downloads (parts are immutable; one that
        # registers it later is caught by the commit's probes): only the commit itself follows the download.
        state = asyncio.ensure_future(self._read_replica_state(part_name))
        try:
            received = await self._download(address, src.root, part_name, tmp_dir, expected)
        except BaseException:
            state.cancel()
            await asyncio.gather(state, return_exceptions=True)
            raise
        part, replaced = await self.commit_new_part(
            tmp_dir, info, received.checksums, received.columns_text, state=state
        )
        self.fetches_total += 1
        log.info("fetched_part", part=part_name, source=source_replica, replaced=[p.name for p in replaced])
        return part, replaced

    async def commit_new_part(
        self,
        tmp_dir: Path,
        info: PartInfo,
        checksums: Checksums,
        columns_text: str | None = None,
        *,
        state: Awaitable[_ReplicaState] | None = None,
    ) -> tuple[LocalPart, list[LocalPart]]:
        """checkPartChecksumsAndCommit for a part made here (fetched, merged): compare with the replicas that
        have it (CorruptedDataError on a mismatch), rename it into place, register it in ZooKeeper and make
        it active.  ``columns_text``: the part's columns.txt (read from ``tmp_dir`` when not given);
        ``state``: the replicas' registrations of the part, being read already.  ``tmp_dir`` is removed when
        anything fails."""
        part_name = info.name
        try:
            if columns_text is None:
                columns_text = (await asyncio.to_thread((tmp_dir / "columns.txt").read_bytes)).decode()
            seen = await (state if state is not None else self._read_replica_state(part_name))
            absent = self._compare(seen, part_name, columns_text, checksums)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
            raise
        part = await self.store.precommit(tmp_dir, info)
        try:
            # the check above stands for the first attempt: a replica registering the part meanwhile makes
            # its probe fail, and everything is checked again
            await self._commit_to_zookeeper(part_name, columns_text, checksums, absent, seen.columns_version)
        except BaseException:
            await self.store.rollback(part_name)
            raise
        return part, self.store.activate(part_name)

    async def register_local_part(self, part: LocalPart) -> None:
        """Register an active local part missing from ``replicas/<me>/parts`` (checked like a fetched one)."""
        columns_text = part.directory.columns_text
        checksums = part.directory.checksums
        seen = await self._read_replica_state(part.name)
        absent = self._compare(seen, part.name, columns_text, checksums)
        await self._commit_to_zookeeper(part.name, columns_text, checksums, absent, seen.columns_version)
        log.warning("registered_local_part", part=part.name)

    async def _zk_checksums(self, replica: str, part_name: str) -> MinimalisticChecksums | None:
        """The source's checksums for the part as recorded in ZooKeeper (old child node or new header)."""
        rp = self.paths.replica(replica)
        try:
            data, _ = await self.keeper.get(rp.part_checksums(part_name))
            return MinimalisticChecksums.parse(data)
        except KeeperNoNodeError:
            pass
        try:
            data, _ = await self.keeper.get(rp.part(part_name))
        except KeeperNoNodeError:
            return None
        if data.startswith(b"part header format version:"):
            return PartHeader.parse(data).checksums
        return None

    async def _download(
        self,
        address: ReplicaAddress,
        source_replica_path: str,
        part_name: str,
        tmp_dir: Path,
        expected: MinimalisticChecksums | None,
    ) -> ReceivedPart:
        params = {
            "endpoint": f"DataPartsExchange:{source_replica_path}",
            "part": part_name,
            "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION),
            "compress": "false",
        }
        url = f"{address.base_url}/"
        sink = PartSink(tmp_dir, self.fsync)  # the directory is made while the request travels
        try:
            async with self._http().post(url, params=params, headers=self.credentials.headers()) as resp:
                if resp.status == 429:
                    raise FetchError(
                        f"Too busy replica {address.host}:{address.replication_port} (429). Will try later.",
                        code=364,
                    )
                if resp.status != 200:
                    text = (await resp.content.read(2000)).decode("utf-8", "replace")
                    raise FetchError(f"Fetching part {part_name} failed: HTTP {resp.status}: {text.strip()}")
                cookie = resp.cookies.get("server_protocol_version")
                version = int(cookie.value) if cookie is not None and cookie.value.isdigit() else 0
                received = await receive_part(resp.content, tmp_dir, version, expected, sink=sink)
        except BaseException as e:
            await asyncio.shield(sink.discard())
            if isinstance(e, aiohttp.ClientError):
                raise FetchError(
                    f"Fetching part {part_name} from {address.host}:{address.replication_port}: {e}"
                ) from e
            if isinstance(e, TimeoutError):
                raise FetchError(f"Timeout fetching part {part_name} from {address.host}") from e
            raise
        if received.body_size == 0:  # pragma: no cover - receive_part refuses empty bodies already
            raise CorruptedDataError(f"Empty answer for part {part_name}")
        threshold = self.min_bytes_to_fsync
        if not self.fsync and threshold and received.checksums.total_size >= threshold:
            await asyncio.to_thread(fsync_part_files, tmp_dir)
        return received

    async def _read_replica_state(self, part_name: str) -> _ReplicaState:
        """What every replica registered for the part, in pipelined rounds: the replica list (and the table's
        ``columns`` version); every replica's ``columns`` child; then, where it exists, the ``checksums``
        child and the ``columns`` version again (unchanged = a consistent pair), elsewhere the part node
        (absent, or a single-node header)."""
        known = self.columns_version
        names, columns_version = await asyncio.gather(
            self.keeper.get_children(self.paths.replicas),
            _value(known) if known is not None else self._columns_version(),
        )
        if self.paths.replica_name not in names:  # always checked: absent tells whether we registered it
            names.append(self.paths.replica_name)
        rps = [self.paths.replica(r) for r in names]
        columns = await self.keeper.get_many([rp.part_columns(part_name) for rp in rps])
        second: list[Awaitable[object]] = []
        for rp, col in zip(rps, columns, strict=True):
            if col is None:
                second.append(self._get_or_none(rp.part(part_name)))
            else:
                second.append(self._get_or_none(rp.part_checksums(part_name)))
                second.append(self.keeper.exists(rp.part_columns(part_name)))
        answers = await asyncio.gather(*second)
        return _ReplicaState(tuple(rps), tuple(columns), tuple(answers), columns_version)

    def _compare(
        self, seen: _ReplicaState, part_name: str, columns_text: str, checksums: Checksums
    ) -> set[str]:
        """Check ``checksums`` against the replicas that registered the part (CorruptedDataError on a
        mismatch); returns the part paths of the replicas without it."""
        mine = MinimalisticChecksums.from_checksums(checksums)
        answers = iter(seen.answers)
        columns_hash = SipHash().update(columns_text.encode()).digest128()
        absent: set[str] = set()
        for rp, col in zip(seen.replicas, seen.columns, strict=True):
            if col is None:
                node = cast("tuple[bytes, ZnodeStat] | None", next(answers))
                if node is None:
                    absent.add(rp.part(part_name))
                elif node[0].startswith(b"part header format version:"):
                    header = PartHeader.parse(node[0])
                    if header.columns_hash == columns_hash:
                        header.checksums.check_equal(mine, True)
                continue
            raw = cast("tuple[bytes, ZnodeStat] | None", next(answers))
            after = cast("ZnodeStat | None", next(answers))
            theirs_columns, stat_before = col
            if theirs_columns.decode() != columns_text:
                log.info("not_checking_checksums_columns_differ", part=part_name, replica=rp.name)
                continue
            if raw is None or after is None or after.version != stat_before.version:
                continue
            MinimalisticChecksums.parse(raw[0]).check_equal(mine, True)
        return absent

    async def _commit_to_zookeeper(
        self,
        part_name: str,
        columns_text: str,
        checksums: Checksums,
        absent: set[str] | None = None,
        columns_version: int | None = None,
    ) -> None:
        """Register the part under ``replicas/<me>/parts``; ``absent`` / ``columns_version``: from a check
        just made (used by the first attempt)."""
        me = self.paths.me
        for _attempt in range(10):
            if absent is None or columns_version is None:
                seen = await self._read_replica_state(part_name)
                absent = self._compare(seen, part_name, columns_text, checksums)
                columns_version = seen.columns_version
            missing, absent = absent, None
            if me.part(part_name) not in missing:  # our own node is there already
                log.warning("part_node_already_exists", part=part_name)
                return
            probes: list[Op] = []
            for path in sorted(missing):
                if path == me.part(part_name):
                    continue
                probes += [Create(path, b""), Delete(path)]
            ops = probes + part_commit_ops(self.paths, part_name, columns_text, checksums, columns_version)
            try:
                await self.keeper.multi(ops)
                return
            except KeeperMultiError as e:
                if e.index < len(probes) and isinstance(e.cause, KeeperNodeExistsError):
                    log.info("part_appeared_on_replica_rechecking", part=part_name, path=ops[e.index].path)
                    continue
                raise
        raise ReplicadError(
            f"Could not commit fetched part {part_name}: replicas keep changing", retriable=True
        )

    async def _columns_version(self) -> int:
        return (await self.keeper.get(self.paths.columns))[1].version


async def _value(v: T) -> T:
    return v


def _consume_error(task: asyncio.Task[bool]) -> None:
    """A precheck nobody awaited must not log 'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()
