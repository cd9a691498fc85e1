"""Taking part in the replicas' leader election (``<zk>/leader_election``), as a polite candidate.

ClickHouse 18.16 elects one leader per table: every replica holds an EPHEMERAL_SEQUENTIAL
``leader_election-NNNNNNNNNN`` node (data: its replica name) and the smallest one leads — it assigns merges
and mutations, cleans the shared log and executes OPTIMIZE/ALTER PARTITION queries that the other replicas
forward to it over the native protocol.  18.16 also counts these nodes as the live replicas when checking
``insert_quorum``, so replicad must hold one or quorum inserts on ClickHouse would not count it.

replicad cannot serve forwarded native-protocol queries, so it yields: whenever its node is the smallest while
an 18.16 candidate (a node whose data lacks the modern `` (multiple leaders Ok)`` suffix) is waiting, it
re-creates its node at the end of the line.  Its own data carries that suffix, which modern ClickHouse
(20.6+) also writes and which modern replicas require of the smallest node before they lead themselves.
"""

from __future__ import annotations

from collections.abc import Callable

from replicad.errors import KeeperError, KeeperNoNodeError
from replicad.keeper.client import Keeper, WatchEvent
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger

log = get_logger(__name__)

MULTIPLE_LEADERS_SUFFIX = " (multiple leaders Ok)"
PREFIX = "leader_election-"


class LeaderElection:
    def __init__(self, keeper: Keeper, paths: TablePaths) -> None:
        self.keeper = keeper
        self.paths = paths
        self.node: str | None = None  # our node's name
        self.session_id: int | None = None
        self.yields = 0
        self.wake: Callable[[], None] = lambda: None

    @property
    def data(self) -> bytes:
        return (self.paths.replica_name + MULTIPLE_LEADERS_SUFFIX).encode()

    async def join(self) -> None:
        """Create our candidate node (again after a session loss)."""
        await self.leave()
        created = await self.keeper.create(
            f"{self.paths.leader_election}/{PREFIX}", self.data, ephemeral=True, sequence=True
        )
        self.node = basename(created)
        self.session_id = self.keeper.session_id
        log.info("joined_leader_election", node=self.node)

    async def leave(self) -> None:
        if self.node is None:
            return
        node, self.node = self.node, None
        if self.session_id != self.keeper.session_id:
            return  # the ephemeral node went with the old session
        try:
            await self.keeper.delete(f"{self.paths.leader_election}/{node}")
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            log.warning("leave_leader_election_failed", error=str(e))

    def _on_change(self, _event: WatchEvent) -> None:
        self.wake()

    async def check(self) -> bool:
        """Yield if we lead while an 18.16 replica waits; True if we yielded."""
        if self.node is None:
            return False
        children = sorted(
            c
            for c in await self.keeper.get_children(self.paths.leader_election, watch=self._on_change)
            if c.startswith(PREFIX)
        )
        if self.node not in children:
            if self.session_id == self.keeper.session_id:
                await self.join()  # our node vanished (removed by hand?): stand again
            return False
        if children[0] != self.node or len(children) == 1:
            return False
        others = await self.keeper.get_many([f"{self.paths.leader_election}/{c}" for c in children[1:]])
        waiting_18_16 = any(
            n is not None and not n[0].endswith(MULTIPLE_LEADERS_SUFFIX.encode()) for n in others
        )
        if not waiting_18_16:
            return False
        self.yields += 1
        log.info("yielding_leadership", node=self.node)
        await self.join()
        return True
