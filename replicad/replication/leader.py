"""Leader election among a table's replicas (``<zk>/leader_election``), as ClickHouse 18.16 runs it.

Every replica that may lead holds one EPHEMERAL_SEQUENTIAL node ``leader_election-NNNNNNNNNN`` whose data is
its replica name.  The child names are sorted as strings and the smallest one leads; every other candidate
watches the node just before its own (no herd effect) and looks again when that node goes away.  The leader
alone assigns merges and mutations (MERGE_PARTS / MUTATE_PART log entries) and runs OPTIMIZE / DROP PARTITION
/ TRUNCATE; it stops the moment its session is suspended or lost, and the node vanishing with its session
hands leadership to the next candidate.  18.16 also counts these nodes as the live replicas when it checks
``insert_quorum``.

Because replicad writes exactly what 18.16 writes, a set mixing both elects one leader.  Modern ClickHouse
(21.12+) no longer elects: it keeps a persistent ``leader_election-0`` = ``all (multiple leaders Ok)`` that
sorts first, so — like 18.16 — replicad never leads beside such a node (modern replicas all assign merges
themselves, serialised by the ``/log`` version, which replicad's assignments check too).

``join`` creates the node (after the replica is activated; again after a session loss), ``check`` decides
whether we lead and re-arms the predecessor watch, ``leave`` deletes the node (first giving up leadership,
so only one replica assigns merges at any time).  ``on_change`` callbacks hear every leadership change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from replicad.errors import KeeperError, KeeperNoNodeError
from replicad.keeper.client import Keeper, SessionState, WatchEvent
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger

log = get_logger(__name__)

PREFIX = "leader_election-"
#: What 20.6–21.11 append to the replica name (and 21.12+ writes as ``all (multiple leaders Ok)``).
MULTIPLE_LEADERS_SUFFIX = " (multiple leaders Ok)"


def leader_of(children: list[str]) -> str | None:
    """The node that leads among ``leader_election``'s children (smallest name), if any."""
    return min(children) if children else None


class LeaderElection:
    """This replica's candidacy for one table."""

    def __init__(self, keeper: Keeper, paths: TablePaths, *, can_become_leader: bool = True) -> None:
        self.keeper = keeper
        self.paths = paths
        self.can_become_leader = can_become_leader
        self.node: str | None = None  # our node's name, e.g. leader_election-0000000003
        self.session_id: int | None = None
        self.leader_node: str | None = None  # the smallest child seen by the last check
        self.became_leader_total = 0
        #: called (on the loop) when a watch says the candidates changed; the owner then calls ``check``
        self.wake: Callable[[], None] = lambda: None
        #: called with the new value whenever ``is_leader`` changes
        self.on_change: list[Callable[[bool], None]] = []
        self._leader = False
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------------------------------- state

    @property
    def data(self) -> bytes:
        return self.paths.replica_name.encode()

    @property
    def is_leader(self) -> bool:
        """True while we lead *and* the session that holds our node is connected."""
        return (
            self._leader
            and self.node is not None
            and self.keeper.session_state is SessionState.CONNECTED
            and self.session_id == self.keeper.session_id
        )

    def _set_leader(self, value: bool) -> None:
        if value == self._leader:
            return
        self._leader = value
        if value:
            self.became_leader_total += 1
            log.info("became_leader", node=self.node, table=self.paths.zk_path)
        else:
            log.info("stopped_being_leader", node=self.node, table=self.paths.zk_path)
        for cb in list(self.on_change):
            try:
                cb(value)
            except Exception as e:  # a broken listener must not break the election
                log.warning("leader_change_callback_failed", error=str(e))

    # ------------------------------------------------------------------------------------------- actions

    async def join(self) -> None:
        """Create our candidate node (again after a session loss) and look at the candidates."""
        async with self._lock:
            await self._leave_locked()
            if not self.can_become_leader:
                return
            created = await self.keeper.create(
                f"{self.paths.leader_election}/{PREFIX}", self.data, ephemeral=True, sequence=True
            )
            self.node = basename(created)
            self.session_id = self.keeper.session_id
            log.info("joined_leader_election", node=self.node)
        await self.check()

    async def leave(self) -> None:
        """Give up leadership, then delete our node (so no two replicas ever assign merges at once)."""
        async with self._lock:
            await self._leave_locked()

    async def _leave_locked(self) -> None:
        self._set_leader(False)
        if self.node is None:
            return
        node, self.node = self.node, None
        if self.session_id != self.keeper.session_id or self.keeper.session_state is SessionState.LOST:
            return  # the ephemeral node went with the old session
        try:
            await self.keeper.delete(f"{self.paths.leader_election}/{node}")
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            log.warning("leave_leader_election_failed", node=node, error=str(e))

    def _on_watch(self, _event: WatchEvent) -> None:
        self.wake()

    async def check(self) -> bool:
        """18.16's LeaderElection::threadFunction: lead if our node is the smallest, else watch the one just
        before ours.  Returns ``is_leader``."""
        async with self._lock:
            return await self._check_locked()

    async def _check_locked(self) -> bool:
        if self.node is None:
            self._set_leader(False)
            return False
        if (
            self.keeper.session_state is not SessionState.CONNECTED
            or self.session_id != self.keeper.session_id
        ):
            self._set_leader(False)  # suspended: stop assigning until we know the session survived
            if self.keeper.session_state is SessionState.LOST or (
                self.keeper.session_id is not None and self.session_id != self.keeper.session_id
            ):
                self.node = None  # gone with the session; ``join`` stands again
            return False
        children = sorted(await self.keeper.get_children(self.paths.leader_election))
        self.leader_node = leader_of(children)
        if self.node not in children:
            log.warning("leader_election_node_vanished", node=self.node)
            self._set_leader(False)
            self.node = None
            return False
        index = children.index(self.node)
        if index == 0:
            self._set_leader(True)
            return True
        self._set_leader(False)
        predecessor = f"{self.paths.leader_election}/{children[index - 1]}"
        if await self.keeper.exists(predecessor, watch=self._on_watch) is None:
            return await self._check_locked()  # it went away meanwhile: look again at once
        return False

    def status(self) -> dict[str, object]:
        return {
            "is_leader": self.is_leader,
            "leader_election_node": self.node or "",
            "leader_node": self.leader_node or "",
            "became_leader_total": self.became_leader_total,
        }
