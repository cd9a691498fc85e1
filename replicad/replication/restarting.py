"""The restarting thread (ClickHouse's ``ReplicatedMergeTreeRestartingThread``): read-only mode and recovery.

The table is writable only while its ZooKeeper session is connected and the start-up sequence
(``tryStartup``: create/join the table, activate the replica, clone it if lost, check parts, load the queue,
stand for leader) has run in that session.  Otherwise it is *read-only*: inserts fail with ReadOnlyError
(HTTP 503, retriable) while SELECTs keep reading the local parts, and the background work that needs
ZooKeeper pauses (the queue executor, the part check, the cleanup look at ``is_readonly``).

* the session is suspended (connection lost) → read-only at once;
* the connection comes back within the same session (never reported lost) and our ``is_active`` is still
  ours → writable again, no re-initialisation (nothing ephemeral was lost);
* the session expired (or was declared lost) → when a new session is connected, the start-up sequence runs
  again: ``is_active`` is re-created (an old node of ours is replaced; one held by another live process makes
  activation fail and it is retried until that node goes with its session), the queue is reloaded, the
  replica is cloned if it was marked lost meanwhile, leadership is contested again;
* ZooKeeper unreachable at start-up → the table starts read-only, serves reads, and this thread completes
  the start-up once ZooKeeper answers.

After a recovery every queue entry may be retried at once (failures caused by the outage must not keep their
back-off), and the tasks are woken.  Inserts whose commit answer was lost are settled by the part check
(:mod:`replicad.replication.part_check`), which needs ZooKeeper and so runs after the recovery.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from replicad.errors import (
    KeeperConnectionLossError,
    KeeperError,
    KeeperNoNodeError,
    KeeperOperationTimeoutError,
    KeeperSessionExpiredError,
    ReplicadError,
)
from replicad.keeper.client import Keeper, SessionState
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.queue_state import QueueState
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)

#: errors meaning "ZooKeeper is not reachable right now" (anything else at first start-up is fatal)
CONNECTION_ERRORS: tuple[type[KeeperError], ...] = (
    KeeperConnectionLossError,
    KeeperOperationTimeoutError,
    KeeperSessionExpiredError,
)
RETRY_MIN_S = 0.5
RETRY_MAX_S = 5.0


class RestartingThread(BackgroundTask):
    """Tracks the session of one table replica; runs its start-up again after a session loss."""

    def __init__(
        self,
        name: str,
        keeper: Keeper,
        paths: TablePaths,
        *,
        identifier: str,
        startup: Callable[[], Awaitable[None]],
        queue_state: QueueState | None = None,
        on_restarted: Callable[[], None] = lambda: None,
        period_s: float = 10.0,  # a safety net: every session state change wakes the task
    ) -> None:
        super().__init__(name, period_s)
        self.keeper = keeper
        self.paths = paths
        self.identifier = identifier
        self._startup = startup
        self.queue_state = queue_state
        self.on_restarted = on_restarted
        #: True until the start-up sequence completed in the current session
        self.readonly = True
        self.readonly_since: float | None = time.time()
        self.readonly_reason = "starting"
        self.session_id: int | None = None
        self.startups_total = 0
        self.resumed_total = 0
        self.failed_startups_total = 0
        self.last_error = ""
        self._failures = 0
        #: the session was reported lost since the last start-up: everything ephemeral must be redone, even
        #: if the same session id comes back (kazoo declares "lost" locally after a long suspension)
        self._lost_seen = False
        #: SYSTEM RESTART REPLICA asked for a start-up that has not completed yet
        self.restart_requested = False
        keeper.add_state_listener(self._on_state)

    def close(self) -> None:
        self.keeper.remove_state_listener(self._on_state)

    def request_restart(self, reason: str) -> None:
        """Run the whole start-up sequence again (SYSTEM RESTART REPLICA): read-only until it is done."""
        self.restart_requested = True
        self._lost_seen = True
        self._enter_readonly(reason)
        self.wakeup()

    # ------------------------------------------------------------------------------------------ state

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._lost_seen = True
        if state is not SessionState.CONNECTED:
            self._enter_readonly(f"zookeeper session {state}")
        self.wakeup()

    def _enter_readonly(self, reason: str) -> None:
        if not self.readonly:
            log.warning("replica_readonly", replica_path=self.paths.me.root, reason=reason)
            self.readonly = True
            self.readonly_since = time.time()
        self.readonly_reason = reason

    def _leave_readonly(self) -> None:
        if self.readonly:
            log.info(
                "replica_writable",
                replica_path=self.paths.me.root,
                readonly_s=round(time.time() - (self.readonly_since or time.time()), 3),
            )
        self.readonly = False
        self.readonly_since = None
        self.readonly_reason = ""

    def status(self) -> dict[str, Any]:
        return {
            "is_readonly": self.readonly,
            "readonly_since": self.readonly_since,
            "readonly_reason": self.readonly_reason,
            "startups_total": self.startups_total,
            "resumed_total": self.resumed_total,
            "failed_startups_total": self.failed_startups_total,
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------------------------------ start-up

    async def startup(self) -> None:
        """Run the start-up sequence now (errors propagate); the replica is writable afterwards."""
        session = self.keeper.session_id
        self._lost_seen = False
        await self._startup()
        if self.keeper.session_id != session or self.keeper.session_state is not SessionState.CONNECTED:
            raise KeeperSessionExpiredError("the ZooKeeper session changed during start-up")
        self.session_id = session
        self.restart_requested = False
        self.startups_total += 1
        self._failures = 0
        self.last_error = ""
        self._leave_readonly()

    async def _still_active(self) -> bool:
        """Is ``is_active`` the node we created in this very session?"""
        try:
            data, stat = await self.keeper.get(self.paths.me.is_active)
        except KeeperNoNodeError:
            return False
        return data.decode(errors="replace") == self.identifier and stat.ephemeral_owner == self.session_id

    def _reset_backoff(self) -> None:
        if self.queue_state is None:
            return
        for qe in self.queue_state.entries:
            qe.retry_not_before = 0.0

    async def run_once(self) -> Outcome:
        state = self.keeper.session_state
        if state is not SessionState.CONNECTED:
            self._enter_readonly(f"zookeeper session {state}")
            return Outcome("waiting_for_zookeeper", fields={"state": str(state)})
        if not self.readonly and self.keeper.session_id == self.session_id:
            # every session state change wakes the task: the 10 s safety net is for the states above (a
            # wake-up per table every 10 s was the largest share of an idle daemon's wake-ups)
            return Outcome("idle", delay_s=IDLE_RECHECK_S)
        try:
            if (
                self.session_id is not None
                and self.keeper.session_id == self.session_id
                and not self._lost_seen
            ):
                if await self._still_active():
                    self._leave_readonly()
                    self.resumed_total += 1
                    self._after_recovery()
                    return Outcome("resumed", did_work=True)
            await self.startup()
        except ReplicadError as e:
            self._failures += 1
            self.failed_startups_total += 1
            self.last_error = f"{type(e).__name__}: {e}"
            delay = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** min(self._failures - 1, 8))
            log.warning(
                "replica_restart_failed", replica_path=self.paths.me.root, error=str(e), retry_s=delay
            )
            return Outcome("restart_failed", delay_s=delay, fields={"error": self.last_error})
        self._after_recovery()
        log.info("replica_restarted", replica_path=self.paths.me.root, session_id=self.session_id)
        return Outcome("restarted", did_work=True)

    def _after_recovery(self) -> None:
        self._reset_backoff()
        self.on_restarted()
