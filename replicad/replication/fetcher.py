"""executeFetch / fetchPart: download a part from another replica over DataPartsExchange and commit it.
Source choice: :mod:`replicad.replication.fetch_sources`.  Download: ``POST http://<host>:<port>/?endpoint=DataPartsExchange:<zk>/replicas/<src>&part=<name>
&client_protocol_version=N&compress=false`` (Basic auth when configured); the ``server_protocol_version``
cookie (absent = 0, as from 18.16) selects the body layout.  The body goes into ``tmp-fetch_<name>``
(a stale directory of that name is removed first) by :mod:`replicad.storage.part_receive`, streamed, or
when its sender gave a ``Content-Length`` of at most 2 MiB read whole and received in one worker-thread trip;
either checks every file hash, EOF and the received checksums.txt.  Then the source's registration of the part
(``parts/<name>`` with the same columns text) must have the same minimalistic checksums (uncompressed hashes
of compressed files included): 18.16's ``checkPartChecksumsAndCommit`` compares with every replica, which
made each fetch's requests grow with the replica count (see :mod:`replicad.replication.checksum_compare`;
when the source's registration cannot be compared, and for the parts made here, every replica is read and
compared as 18.16 does, with create+remove probes in the commit for the replicas without the part).  The
directory is renamed to the part's name; one multi creates ``replicas/<me>/parts/<name>`` (+
``columns``/``checksums``); the part becomes active and the parts it covers outdated.

Early downloads (live replication): when a small batch of GET_PART entries is read from the log, the download
of each part from its source replica starts at once, while the entries are still being copied into our
queue (one ZooKeeper write, the slowest step of pulling).  Only the download: when the queue executor later
runs the entry and picks the same source, the fetch takes the downloaded directory and goes on with the
checks and the commit as usual; whatever it does not take is removed ``EARLY_TTL_S`` after it arrived.
At most ``MAX_EARLY_FETCHES`` run at a time, beyond the executor's fetch limits."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import aiohttp

from replicad.errors import (
    CorruptedDataError,
    FetchError,
    KeeperConnectionLossError,
    KeeperError,
    KeeperNoNodeError,
    KeeperOperationTimeoutError,
    NoReplicaHasPartError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Op
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.address import ReplicaAddress
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.replication import checksum_compare, zero_copy_fetch
from replicad.replication.checksum_compare import ReplicaState, compare_with_replicas, read_registrations
from replicad.replication.early_fetch import MAX_EARLY_FETCHES, EarlyDownload
from replicad.replication.exchange import FetchCredentials
from replicad.replication.fetch_sources import MAX_PRECHECKS, FetchSource, SourceFinder, consume_error
from replicad.replication.part_store import LocalPart, PartStore
from replicad.replication.queue_finish import QueueFinish
from replicad.storage.checksums import Checksums, MinimalisticChecksums
from replicad.storage.layout import TMP_FETCH
from replicad.storage.part import fsync_part_files
from replicad.storage.part_receive import WHOLE_BODY_MAX_BYTES, ReceivedPart, receive_part, receive_whole_body
from replicad.storage.part_sink import PartSink
from replicad.storage.part_transfer import MAX_PART_BYTES, RECEIVE_MAX_PROTOCOL_VERSION

log = get_logger(__name__)

#: how long a fetch or merge whose commit multi met a connection loss waits for the session to say whether the
#: multi was applied (its part stays, active, if it was)
COMMIT_OUTCOME_WAIT_S = 20.0

T = TypeVar("T")

__all__ = [
    "MAX_PRECHECKS",
    "FetchCredentials",
    "FetchError",
    "FetchSource",
    "NoReplicaHasPartError",
    "PartFetcher",
]


class PartFetcher:
    """Fetches parts of one table from its peers."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        *,
        table_columns_text: str,
        credentials: FetchCredentials | None = None,
        timeout_s: float = 1800.0,
        connect_timeout_s: float = 10.0,
        fsync: bool = False,
        min_bytes_to_fsync: int = 0,
        max_part_bytes: int = MAX_PART_BYTES,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.table_columns_text = table_columns_text
        #: the columns.txt every part of the table has (set by the replica; None: not checked)
        self.part_columns_text: str | None = None
        #: the table's ``columns`` version as the replica knows it (18.16's ``columns_version``; None: read
        #: it from ZooKeeper for each commit); the commit's ``check columns`` proves it current, and a commit
        #: refused by that check reads the version and tries again
        self.known_columns_version: Callable[[], int | None] = lambda: None
        self.credentials = credentials or FetchCredentials()
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s, sock_read=300)
        #: fsync every fetched part (``fsync``), or those of at least ``min_bytes_to_fsync`` bytes
        #: (``min_compressed_bytes_to_fsync_after_fetch``; 0 = never, ClickHouse's default)
        self.fsync = fsync
        self.min_bytes_to_fsync = min_bytes_to_fsync
        self.max_part_bytes = max_part_bytes
        self.sources = SourceFinder(keeper, paths)
        self._session: aiohttp.ClientSession | None = None
        self._fetching: set[str] = set()
        #: part -> its early download
        self._early: dict[str, EarlyDownload] = {}
        self.max_early_fetches = MAX_EARLY_FETCHES
        #: whether early downloads may start (the replica wires it to "the queue executor is not paused")
        self.early_allowed: Callable[[], bool] = lambda: True
        self.fetches_total = 0
        self.zero_copy_fetches = 0  # fetches that moved metadata only (S3 zero-copy)
        self.bytes_received = 0  # DataPartsExchange body bytes of finished downloads
        self.early_fetches_taken = 0
        self.whole_fetches = 0  # downloads of a small body read whole (receive_whole_body)

    async def close(self) -> None:
        self.sources.close()
        early, self._early = list(self._early.values()), {}
        for e in early:
            e.task.cancel()
        await asyncio.gather(*(self._drop_early(e) for e in early))
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # read_bufsize: aiohttp's default (each doubling cost a fetch ~0.5-1 MiB of peak RSS, no CPU)
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar(), read_bufsize=1 << 16
            )
        return self._session

    # ------------------------------------------------------------------------------------- source choice

    async def find_source(
        self, part_name: str, *, active: bool = True, hint: str | None = None
    ) -> FetchSource | None:
        """See :meth:`replicad.replication.fetch_sources.SourceFinder.find`.  A part downloaded early from
        ``hint`` is taken from there: the download proved that the replica has the part (whether it is still
        active no longer matters, the bytes are here; the commit checks them against every replica's
        registration)."""
        early = self._early.get(part_name)
        if hint and early is not None and early.source == hint and not early.stale():
            try:
                if await asyncio.shield(early.task) is not None:
                    return FetchSource(hint, part_name, 0, 0)
            except Exception:  # the fetch drops it; look for a source as usual
                pass
        return await self.sources.find(part_name, active=active, hint=hint)

    def precheck_sources(self, entries: list[LogEntry]) -> None:
        """Entries just read from the log (before they are copied into the queue): for a small batch, each
        GET_PART's download starts at once when its source's address is known (see the module docstring);
        the sources of the others are checked, and their downloads start after the check."""
        early_ok = len(entries) <= self.max_early_fetches and self.early_allowed()
        if early_ok:
            self._expire_early()
        rest: list[LogEntry] = []
        for e in entries:
            source = e.source_replica
            host = self.sources.known_host(source) if source else None
            if early_ok and host is not None and e.type is LogEntryType.GET_PART and self._may_start(e):
                self._start_early(e.new_part_name, source, None)
            else:
                rest.append(e)
        checks = self.sources.precheck(rest)
        if early_ok:
            for (part_name, source), check in checks.items():
                if self._may_start_part(part_name):
                    self._start_early(part_name, source, check)

    def _may_start(self, entry: LogEntry) -> bool:
        return entry.source_replica != self.paths.replica_name and self._may_start_part(entry.new_part_name)

    def _may_start_part(self, part_name: str) -> bool:
        return (
            len(self._early) < self.max_early_fetches
            and part_name not in self._fetching
            and part_name not in self._early
            and not self._have(part_name)
        )

    def _start_early(self, part_name: str, source: str, check: Awaitable[bool] | None) -> None:
        task = asyncio.ensure_future(self._early_download(part_name, source, check))
        task.add_done_callback(consume_error)
        early = self._early[part_name] = EarlyDownload(source, task, time.monotonic())
        task.add_done_callback(lambda _t: setattr(early, "finished", time.monotonic()))

    def _have(self, part_name: str) -> bool:
        """The part, or one covering it, is here already (active or pre-committed)."""
        return self.store.active_containing(PartInfo.parse(part_name)) is not None

    # ------------------------------------------------------------------------------------- early downloads

    async def _early_download(
        self, part_name: str, source: str, check: Awaitable[bool] | None
    ) -> tuple[ReceivedPart, ReplicaState | None] | None:
        """Download ``part_name`` from ``source``; None when the source turns out not to have it.

        When the source's address is known already, the download starts at once (the check's reads queue
        behind the copy of the entries in our ZooKeeper session); the source's checksums in ZooKeeper are then
        compared by the commit, as with every replica that has the part."""
        host = self.sources.known_host(source)
        if host is None and (check is None or not await check):
            return None
        received, state = await self._download_from(part_name, source, early=True, host=host)
        try:
            return received, await state
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, received.path, True))
            await asyncio.shield(self._abandon_zero_copy(part_name))
            raise
        except Exception:  # read again by the commit
            return received, None

    async def _drop_early(self, early: EarlyDownload, abandon: bool = True) -> None:
        """Wait for an early download to end and remove what it left (a part nobody took)."""
        try:
            result = await early.task
        except BaseException:  # cancelled or failed: receive_part removed its directory
            return
        if result is not None:
            await asyncio.to_thread(shutil.rmtree, result[0].path, True)
            if abandon:  # its zero-copy lock and metadata (not while a fetch of the part runs)
                await self._abandon_zero_copy(result[0].path.name.removeprefix(TMP_FETCH))

    def _expire_early(self) -> None:
        for name, early in list(self._early.items()):
            if early.stale():
                del self._early[name]
                early.task.cancel()
                drop = asyncio.ensure_future(self._drop_early(early, abandon=name not in self._fetching))
                drop.add_done_callback(consume_error)

    async def _take_early(
        self, part_name: str, source: str
    ) -> tuple[ReceivedPart, ReplicaState | None] | None:
        """The early download of ``part_name`` when it came from ``source`` and succeeded; any other early
        download of the part is stopped and its directory removed first."""
        early = self._early.pop(part_name, None)
        if early is None:
            return None
        if early.source != source or early.stale():
            early.task.cancel()
            await self._drop_early(early)
            return None
        try:
            result = await early.task
        except Exception as e:
            log.info("early_fetch_failed", part=part_name, source=source, error=str(e))
            return None
        if result is not None:
            self.early_fetches_taken += 1
        return result

    # ------------------------------------------------------------------------------------- fetch + commit

    async def fetch_part(
        self, part_name: str, source_replica: str, finish: QueueFinish | None = None
    ) -> tuple[LocalPart, list[LocalPart]] | None:
        """Download ``part_name`` from ``source_replica``, verify and commit it (``finish``: the queue entry's
        removal, in the same multi).  Returns the new part and the parts it made obsolete, or None if the
        part is already being fetched."""
        if part_name in self._fetching:
            log.debug("part_already_fetching", part=part_name)
            return None
        self._fetching.add(part_name)
        try:
            result = await self._fetch(part_name, source_replica, finish)
        except BaseException:
            self.sources.failed(part_name, source_replica)
            raise
        else:
            self.sources.succeeded(part_name, source_replica)
            return result
        finally:
            self._fetching.discard(part_name)

    async def _fetch(self, part_name: str, source_replica: str,
                     finish: QueueFinish | None) -> tuple[LocalPart, list[LocalPart]]:
        info = PartInfo.parse(part_name)
        early = await self._take_early(part_name, source_replica)
        state: Awaitable[ReplicaState] | None
        if early is not None:
            received, seen = early
            state = _value(seen) if seen is not None else None
        else:
            received, state = await self._download_from(part_name, source_replica)
        written = received.written if self.store.remote is None else None  # (zero-copy: other files)
        part, replaced = await self.commit_new_part(received.path, info, received.checksums,
                                                    received.columns_text, state=state, written=written,
                                                    finish=finish)
        self.fetches_total += 1
        log.info("fetched_part", part=part_name, source=source_replica, replaced=[p.name for p in replaced])
        return part, replaced

    async def _download_from(
        self, part_name: str, source_replica: str, *, early: bool = False, host: bytes | None = None
    ) -> tuple[ReceivedPart, asyncio.Future[ReplicaState]]:
        """Download into ``tmp-fetch_<part>``; also returns the read of what the source registered for the
        part, started alongside (parts are immutable): only the commit itself follows the download.
        ``host``: the source's address, known already.  Our own registration is not read: the commit's
        create of our part node proves it absent (when it exists, everything is read again, ours
        included)."""
        src = self.paths.replica(source_replica)
        details = self.sources.take_details(part_name, source_replica)
        if host is not None:
            raw_host = host
        elif details is not None and details.host is not None:
            raw_host = details.host
        elif details and (kept := self.sources.current_host(source_replica, details.active_czxid)):
            raw_host = kept  # read meanwhile by another fetch, beside the same is_active
        else:
            node = await self.sources.read_host(source_replica)
            if node is None:
                raise KeeperNoNodeError(f"get {src.host}: no such node")
            raw_host = node[0]
            self.sources.remember_host(source_replica, raw_host, details.active_czxid if details else -1)
        address = ReplicaAddress.parse(raw_host)
        tmp_dir = self.store.layout.tmp_path(TMP_FETCH, part_name)
        # a stale directory of that name is removed by the part's writer thread (PartSink.replace_stale) as it
        # makes the directory: no stat on the loop per fetch; the zero-copy path fills it otherwise
        if self.store.remote is not None and await asyncio.to_thread(tmp_dir.exists):
            log.warning("removing_stale_fetch_dir", dir=str(tmp_dir))
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
        log.info(
            "fetching_part",
            part=part_name,
            source=source_replica,
            host=address.host,
            port=address.replication_port,
            early=early,
        )
        state = asyncio.ensure_future(
            self._read_replica_state(part_name, [source_replica], include_self=False, source_only=True))
        try:
            received = await self._download(address, src.root, part_name, tmp_dir, None)
        except BaseException:
            state.cancel()
            await asyncio.gather(state, return_exceptions=True)
            raise
        return received, state

    async def commit_new_part(
        self,
        tmp_dir: Path,
        info: PartInfo,
        checksums: Checksums,
        columns_text: str | None = None,
        *,
        state: Awaitable[ReplicaState] | None = None,
        written: tuple[Checksums, str, int, int | None] | None = None,
        finish: QueueFinish | None = None,
    ) -> tuple[LocalPart, list[LocalPart]]:
        """checkPartChecksumsAndCommit for a part made here (fetched, merged): compare with the replicas that
        have it (CorruptedDataError on a mismatch), rename it into place, register it in ZooKeeper and make
        it active.  ``columns_text``: the part's columns.txt (read from ``tmp_dir`` when not given);
        ``state``: the replicas' registrations of the part, being read already; ``written``: its metadata
        as ``PartStore.precommit`` takes it (not read back).  ``tmp_dir`` is removed when anything fails."""
        part_name = info.name
        try:
            if columns_text is None:
                columns_text = (await asyncio.to_thread((tmp_dir / "columns.txt").read_bytes)).decode()
            seen = await (state if state is not None else self._read_replica_state(part_name))
            if seen.source_only and not checksum_compare.compare_with_source(
                    seen, part_name, columns_text, checksums):
                log.info("source_registration_not_comparable", part=part_name)
                seen = await self._read_replica_state(part_name)  # every replica, as 18.16
            if self.part_columns_text is not None and columns_text != self.part_columns_text and not any(
                    c is not None and c[0] == columns_text.encode() for c in seen.columns):
                # a part with other columns than the table's (written before an ALTER, as 18.16 keeps them)
                # is taken only with the columns a replica registered for it: with others it would skip the
                # comparison with the replicas' checksums (made between parts of the same columns only)
                raise CorruptedDataError(f"Part {part_name} has other columns than the table and than the "
                                         f"replicas registered: its columns.txt is {columns_text[:300]!r}")
            # the source's registration was compared above (a mismatch raised), nobody else is probed
            absent = set() if seen.source_only else compare_with_replicas(seen, part_name, columns_text,
                                                                          checksums)
            if not seen.self_read:
                absent.add(self.paths.me.part(part_name))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
            await asyncio.shield(self._abandon_zero_copy(part_name))
            raise
        part = await self.store.precommit(tmp_dir, info, written)
        try:
            # the check above stands for the first attempt: a replica registering the part meanwhile makes
            # its probe fail, and everything is checked again
            applied = await self._commit_to_zookeeper(part_name, columns_text, checksums, absent,
                                                      seen.columns_version, self_read=seen.self_read,
                                                      optional_ops=finish.ops if finish else None)
        except (KeeperConnectionLossError, KeeperOperationTimeoutError):
            # the multi may have been applied: a rollback would leave ZooKeeper listing a part the disk no
            # longer has (seen in the network-and-disk chaos smoke). Ask once the session is back.
            if await self._registered_after_loss(part_name):
                log.warning("part_commit_outcome_resolved", part=part_name, registered=True)
                return part, self.store.activate(part_name)
            await self.store.rollback(part_name)
            raise
        except BaseException:
            await self.store.rollback(part_name)
            raise
        if finish is not None:
            finish.applied = applied
        return part, self.store.activate(part_name)

    async def _registered_after_loss(self, part_name: str) -> bool:
        """Whether ``replicas/<me>/parts/<part>`` exists, asked until the session answers (up to
        ``COMMIT_OUTCOME_WAIT_S``); False when it does not answer in that time or the session is gone."""
        deadline = time.monotonic() + COMMIT_OUTCOME_WAIT_S
        while True:
            try:
                return await self.keeper.exists(self.paths.me.part(part_name)) is not None
            except (KeeperConnectionLossError, KeeperOperationTimeoutError):
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.5)
            except KeeperError:
                return False

    async def _abandon_zero_copy(self, part_name: str) -> None:
        if self.store.remote is not None:
            await self.store.remote.abandon_fetch(part_name)

    async def register_local_part(self, part: LocalPart) -> None:
        """Register an active local part missing from ``replicas/<me>/parts`` (checked like a fetched one)."""
        columns_text = part.directory.columns_text
        checksums = part.directory.checksums
        seen = await self._read_replica_state(part.name)
        absent = compare_with_replicas(seen, part.name, columns_text, checksums)
        await self._commit_to_zookeeper(part.name, columns_text, checksums, absent, seen.columns_version)
        part.registered = True
        log.warning("registered_local_part", part=part.name)

    async def download_from_address(
        self, address: ReplicaAddress, source_replica_path: str, part_name: str, tmp_dir: Path
    ) -> ReceivedPart:
        """Download a part into ``tmp_dir`` without committing it (the zero-copy mover adopts instances
        this way); zero-copy when the table and the source allow it."""
        return await self._download(address, source_replica_path, part_name, tmp_dir, None)

    async def _download(
        self,
        address: ReplicaAddress,
        source_replica_path: str,
        part_name: str,
        tmp_dir: Path,
        expected: MinimalisticChecksums | None,
        *,
        full: bool = False,
    ) -> ReceivedPart:
        params = {
            "endpoint": f"DataPartsExchange:{source_replica_path}",
            "part": part_name,
            "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION),
            "compress": "false",
        }
        remote = self.store.remote
        zero_copy = remote is not None and remote.zero_copy and not full
        if zero_copy:  # replicas sharing the bucket exchange metadata only
            params[zero_copy_fetch.COOKIE] = remote.disk.disk_type if remote is not None else ""
        url = f"{address.base_url}/"
        sink: PartSink | None = None
        try:
            async with self._http().post(url, params=params, headers=self.credentials.headers(),
                                         ssl=await self.credentials.ssl_for(url)) as resp:
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
                length = resp.content_length
                if remote is not None and zero_copy and resp.cookies.get(zero_copy_fetch.COOKIE) is not None:
                    body = await resp.content.read(zero_copy_fetch.MAX_BODY + 1)
                    if len(body) > zero_copy_fetch.MAX_BODY or not resp.content.at_eof():
                        raise zero_copy_fetch.ZeroCopyFallback(f"zero-copy answer for {part_name} too large")
                    received = await zero_copy_fetch.receive(remote, part_name, body, version, tmp_dir)
                    self.zero_copy_fetches += 1
                elif length is not None and length <= WHOLE_BODY_MAX_BYTES:
                    # a small part's body, read whole: parsed, checked and written in one worker-thread trip
                    whole = await resp.content.readexactly(length)
                    if not resp.content.at_eof() and await resp.content.read(1):  # more than it said
                        raise CorruptedDataError(f"Unexpected data after the part body of {part_name}")
                    received = await asyncio.to_thread(
                        receive_whole_body, whole, tmp_dir, version, expected, fsync=self.fsync,
                        max_part_bytes=self.max_part_bytes, prepared_in=self.store.layout.data_path,
                        replace_stale=True)
                    self.whole_fetches += 1
                else:
                    sink = PartSink(tmp_dir, self.fsync, replace_stale=True,
                                    prepared_in=self.store.layout.data_path)
                    received = await receive_part(resp.content, tmp_dir, version, expected, sink=sink,
                                                  max_part_bytes=self.max_part_bytes)
        except BaseException as e:
            if sink is not None:
                await asyncio.shield(sink.discard())
            if isinstance(e, zero_copy_fetch.ZeroCopyFallback):
                log.warning("zero_copy_fetch_failed_fetching_data", part=part_name, error=str(e))
                return await self._download(address, source_replica_path, part_name, tmp_dir, expected,
                                            full=True)
            if isinstance(e, asyncio.IncompleteReadError):
                raise CorruptedDataError(f"Truncated part body for {part_name}: {len(e.partial)} of "
                                         f"{e.expected} bytes") from e
            if isinstance(e, aiohttp.ClientError):
                raise FetchError(
                    f"Fetching part {part_name} from {address.host}:{address.replication_port}: {e}"
                ) from e
            if isinstance(e, TimeoutError):
                raise FetchError(f"Timeout fetching part {part_name} from {address.host}") from e
            raise
        if received.replaced_stale or (sink is not None and sink.replaced_stale):
            log.warning("removing_stale_fetch_dir", dir=str(tmp_dir))
        if received.body_size == 0:  # pragma: no cover - receive_part refuses empty bodies already
            raise CorruptedDataError(f"Empty answer for part {part_name}")
        self.bytes_received += received.body_size
        threshold = self.min_bytes_to_fsync
        if not self.fsync and threshold and received.checksums.total_size >= threshold:
            await asyncio.to_thread(fsync_part_files, tmp_dir)
        return received

    async def _read_replica_state(
        self,
        part_name: str,
        replicas: Sequence[str] | None = None,
        *,
        include_self: bool = True,
        fresh_columns_version: bool = False,
        source_only: bool = False,
    ) -> ReplicaState:
        """What every replica registered for the part, in pipelined rounds: the replica list (unless
        ``replicas`` is given: read by this fetch's source choice) and the table's ``columns`` version
        (unless the replica knows it and not ``fresh_columns_version``); every replica's ``columns`` child;
        then, where it exists, the ``checksums`` child and the ``columns`` version again (unchanged = a
        consistent pair), elsewhere the part node (absent, or a single-node header).  ``include_self``:
        our own registration too (else it counts as absent, as ``ReplicaState.self_read`` says)."""
        known = None if fresh_columns_version else self.known_columns_version()
        names, columns_version = await asyncio.gather(
            _value(list(replicas)) if replicas is not None else self.sources.replica_names(),
            _value(known) if known is not None else self._columns_version(),
        )
        return await read_registrations(
            self.keeper, self.paths, part_name, names, columns_version, include_self, source_only=source_only)

    async def _commit_to_zookeeper(
        self,
        part_name: str,
        columns_text: str,
        checksums: Checksums,
        absent: set[str] | None = None,
        columns_version: int | None = None,
        *,
        self_read: bool = True,
        optional_ops: Callable[[], Sequence[Op]] | None = None,
    ) -> bool:
        """Register the part (see :func:`checksum_compare.commit_registration`)."""
        return await checksum_compare.commit_registration(
            self.keeper, self.paths, part_name, columns_text, checksums,
            read_state=lambda fresh: self._read_replica_state(part_name, fresh_columns_version=fresh),
            extra_ops=lambda: self.store.commit_ops(part_name),  # the zero-copy lock, in the same multi
            optional_ops=optional_ops, absent=absent, columns_version=columns_version, self_read=self_read)

    async def _columns_version(self) -> int:
        return (await self.keeper.get(self.paths.columns))[1].version


async def _value(v: T) -> T:
    return v
