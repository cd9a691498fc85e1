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
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from replicad.errors import (
    CorruptedDataError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Delete, Op
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.address import ReplicaAddress
from replicad.model.checksums import Checksums, MinimalisticChecksums, PartHeader
from replicad.model.part_info import PartInfo
from replicad.model.siphash import SipHash
from replicad.replication.commit import part_commit_ops
from replicad.replication.part_store import LocalPart, PartStore
from replicad.storage.layout import TMP_FETCH
from replicad.storage.part import fsync_part_files
from replicad.storage.part_transfer import RECEIVE_MAX_PROTOCOL_VERSION, receive_part

log = get_logger(__name__)

#: a replica that failed to deliver a part is tried last for this long
FAILED_SOURCE_PENALTY_S = 60.0


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
        self.fetches_total = 0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    # ------------------------------------------------------------------------------------- source choice

    async def find_source(self, part_name: str, *, active: bool = True) -> FetchSource | None:
        """The best replica holding ``part_name`` or a part covering it (None: nobody).

        Replicas holding the exact part are found with one ``exists`` each; only when none has it are the
        replicas' part lists read to look for a covering part."""
        target = PartInfo.parse(part_name)
        replicas = [
            r for r in await self.keeper.get_children(self.paths.replicas) if r != self.paths.replica_name
        ]
        random.shuffle(replicas)
        if active:
            alive = await asyncio.gather(
                *(self.keeper.exists(self.paths.replica(r).is_active) for r in replicas)
            )
            replicas = [r for r, st in zip(replicas, alive, strict=True) if st is not None]
        exact = await asyncio.gather(
            *(self.keeper.exists(self.paths.replica(r).part(part_name)) for r in replicas)
        )
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
        progress = await asyncio.gather(*(self._replica_progress(r) for r, _ in found))
        candidates = [FetchSource(r, p, ptr, q) for (r, p), (ptr, q) in zip(found, progress, strict=True)]

        now = time.monotonic()

        def rank(c: FetchSource) -> tuple[bool, int, int, int, int]:
            info = PartInfo.parse(c.part_name)
            failed = self._failed_sources.get((c.part_name, c.replica), -1e18) > now - FAILED_SOURCE_PENALTY_S
            return (not failed, info.max_block - info.min_block, info.level, c.log_pointer, -c.queue_size)

        return max(candidates, key=rank)

    async def _replica_progress(self, replica: str) -> tuple[int, int]:
        rp = self.paths.replica(replica)
        try:
            raw, _ = await self.keeper.get(rp.log_pointer)
            pointer = int(raw) if raw.strip() else 0
        except (KeeperNoNodeError, ValueError):
            pointer = 0
        stat = await self.keeper.exists(rp.queue)
        return pointer, (stat.num_children if stat is not None else 1 << 30)

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
        raw_host, _ = await self.keeper.get(src.host)
        address = ReplicaAddress.parse(raw_host)
        expected = await self._zk_checksums(source_replica, part_name)
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
        received = await self._download(address, src.root, part_name, tmp_dir, expected)
        part, replaced = await self.commit_new_part(tmp_dir, info, received)
        self.fetches_total += 1
        log.info("fetched_part", part=part_name, source=source_replica, replaced=[p.name for p in replaced])
        return part, replaced

    async def commit_new_part(
        self, tmp_dir: Path, info: PartInfo, checksums: Checksums
    ) -> tuple[LocalPart, list[LocalPart]]:
        """checkPartChecksumsAndCommit for a part made here (fetched, merged): compare with the replicas that
        have it (CorruptedDataError on a mismatch), rename it into place, register it in ZooKeeper and make
        it active.  ``tmp_dir`` is removed when anything fails."""
        part_name = info.name
        try:
            columns_text = (await asyncio.to_thread((tmp_dir / "columns.txt").read_bytes)).decode()
            await self._check_with_replicas(part_name, columns_text, checksums)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
            raise
        part = await self.store.precommit(tmp_dir, info)
        try:
            await self._commit_to_zookeeper(part_name, columns_text, checksums)
        except BaseException:
            await self.store.rollback(part_name)
            raise
        return part, self.store.activate(part_name)

    async def register_local_part(self, part: LocalPart) -> None:
        """Register an active local part missing from ``replicas/<me>/parts`` (checked like a fetched one)."""
        columns_text = part.directory.columns_text
        checksums = part.directory.checksums
        await self._check_with_replicas(part.name, columns_text, checksums)
        await self._commit_to_zookeeper(part.name, columns_text, checksums)
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
    ) -> Checksums:
        params = {
            "endpoint": f"DataPartsExchange:{source_replica_path}",
            "part": part_name,
            "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION),
            "compress": "false",
        }
        url = f"{address.base_url}/"
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
                received = await receive_part(resp.content, tmp_dir, version, expected, fsync=self.fsync)
        except aiohttp.ClientError as e:
            raise FetchError(
                f"Fetching part {part_name} from {address.host}:{address.replication_port}: {e}"
            ) from e
        except TimeoutError as e:
            raise FetchError(f"Timeout fetching part {part_name} from {address.host}") from e
        if received.body_size == 0:  # pragma: no cover - receive_part refuses empty bodies already
            raise CorruptedDataError(f"Empty answer for part {part_name}")
        threshold = self.min_bytes_to_fsync
        if not self.fsync and threshold and received.checksums.total_size >= threshold:
            await asyncio.to_thread(fsync_part_files, tmp_dir)
        return received.checksums

    async def _check_with_replicas(self, part_name: str, columns_text: str, checksums: Checksums) -> set[str]:
        """Compare with every replica that registered the part; returns part paths of replicas without it."""
        mine = MinimalisticChecksums.from_checksums(checksums)
        absent: set[str] = set()
        replicas = await self.keeper.get_children(self.paths.replicas)
        columns_hash = SipHash().update(columns_text.encode()).digest128()
        for replica in replicas:
            rp = self.paths.replica(replica)
            try:
                theirs_columns, stat_before = await self.keeper.get(rp.part_columns(part_name))
            except KeeperNoNodeError:
                header = await self._header(rp.part(part_name))
                if header is None:
                    absent.add(rp.part(part_name))
                elif header.columns_hash == columns_hash:
                    header.checksums.check_equal(mine, True)
                continue
            if theirs_columns.decode() != columns_text:
                log.info("not_checking_checksums_columns_differ", part=part_name, replica=replica)
                continue
            try:
                raw, _ = await self.keeper.get(rp.part_checksums(part_name))
            except KeeperNoNodeError:
                continue
            after = await self.keeper.exists(rp.part_columns(part_name))
            if after is None or after.version != stat_before.version:
                continue
            MinimalisticChecksums.parse(raw).check_equal(mine, True)
        return absent

    async def _header(self, path: str) -> PartHeader | None:
        try:
            data, _ = await self.keeper.get(path)
        except KeeperNoNodeError:
            return None
        if data.startswith(b"part header format version:"):
            return PartHeader.parse(data)
        return None

    async def _commit_to_zookeeper(self, part_name: str, columns_text: str, checksums: Checksums) -> None:
        me = self.paths.me
        for _attempt in range(10):
            absent = await self._check_with_replicas(part_name, columns_text, checksums)
            if await self.keeper.exists(me.part(part_name)) is not None:
                log.warning("part_node_already_exists", part=part_name)
                return
            probes: list[Op] = []
            for path in sorted(absent):
                if path == me.part(part_name):
                    continue
                probes += [Create(path, b""), Delete(path)]
            columns_version = self.columns_version
            if columns_version is None:
                columns_version = (await self.keeper.get(self.paths.columns))[1].version
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
