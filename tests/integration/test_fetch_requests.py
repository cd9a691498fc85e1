"""What a fetch costs in ZooKeeper requests (a guard for the scale work: a new replica cloning a table of many
parts, a replica draining a backlog of log entries).

Real ZooKeeper, in-process replicas.  The fetching replica's queue is loaded while its fetches are held; then
they are let go and every request its session sends until it holds every part is counted, by path.  The
bounds are counts, not times.  On the fetch path (the source choice, the comparison with the replicas'
registrations, the commit, the queue node's removal) ``FETCH_PATH`` requests per fetch, plus one read of the
source's address (and a few by other tasks); with everything the replica's other tasks send meanwhile, at most
``MAX_PER_FETCH`` per fetch.  Before the table's ``columns`` version, the source's address and the replica
list were kept, the source's checksums read once and our own registration left to the commit to disprove,
this cost 14.7 requests per fetch for the clone and 13.0 for the backlog (now about 7.0 and 6.3: the
replica list and the source's ``is_active`` are read once for the fetches asking together; ``FETCH_PATH`` is
the count when no two fetches overlap).  The table's
``columns`` node is read at most once (its version is the replica's), the source's ``host`` at most once, the
source's checksums of a part once; ``min_unprocessed_insert_time`` / ``max_processed_insert_time`` are written
only when an entry changes them (every entry that finished meanwhile wrote them again: 17 writes for 20
fetches).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from replicad.keeper.client import Keeper
from replicad.model.log_entry import LogEntryType
from replicad.replica import TableReplica
from replicad.replication.table_context import ActionBlockers
from tests.support.table_cluster import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

N_PARTS = 20  # more than MAX_PRECHECKS: a backlog, checked entry by entry as the entries run
#: requests of one fetch: source choice (clone: the replica list, the source's part and is_active; backlog:
#: the named source's part and is_active), the source's columns and checksums of the part (compared with the
#: source only), the commit with the queue node's removal
FETCH_PATH = 7
#: the same with what the replica's other tasks send meanwhile
MAX_PER_FETCH = 9


def one_row_parts(n: int) -> list[pa.Table]:
    """``n`` one-row blocks, each in its own partition (one month each: parts that never merge)."""
    return [
        pa.table({
            "id": pa.array([i], pa.int32()),
            "ctime": pa.array([dt.datetime(2001 + i // 12, 1 + i % 12, 1)], pa.timestamp("s")),
            "name": pa.array([f"n{i}".encode()], pa.binary()),
            "v": pa.array([i], pa.uint32()),
        })
        for i in range(n)
    ]


class Requests:
    """Every ZooKeeper request sent, by session: (kind, what) in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[int, str]] = []
        real = Keeper._submit

        def submit(keeper: Keeper, kind: str, what: str, start: Callable[[], Any]) -> Any:
            self.sent.append((id(keeper), what))
            return real(keeper, kind, what, start)

        monkeypatch.setattr(Keeper, "_submit", submit)

    def mark(self) -> int:
        return len(self.sent)

    def of(self, keeper: Keeper, since: int) -> list[str]:
        return [what for k, what in self.sent[since:] if k == id(keeper)]


class HeldFetches:
    """GET_PART entries do not start while ``held`` (SYSTEM STOP FETCHES from the replica's start), except on
    the replicas marked free."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = True
        self.free: set[int] = set()
        real = ActionBlockers.reason

        def reason(blockers: ActionBlockers, entry_type: LogEntryType) -> str | None:
            if self.held and entry_type is LogEntryType.GET_PART and id(blockers) not in self.free:
                return "held by the test"
            return real(blockers, entry_type)

        monkeypatch.setattr(ActionBlockers, "reason", reason)


async def fetch_all(r: TableReplica, held: HeldFetches, requests: Requests) -> list[str]:
    """Let ``r``'s held fetches go and return the requests its session sent until it held every part."""
    await wait_for(lambda: len(r.queue_state) == N_PARTS, what="the fetches to be queued")
    since = requests.mark()
    held.held = False
    r.executor.wakeup()
    await wait_for(lambda: len(r.store.active()) == N_PARTS and len(r.queue_state) == 0,
                   what="every part to be fetched")
    return requests.of(r.keeper, since)


def check_costs(sent: list[str], r: TableReplica, source: str) -> None:
    me = r.paths.me
    times = [w for w in sent if w.startswith(f"multi (1 ops, first: set {me.root}/m")
             or w.startswith(f"multi (2 ops, first: set {me.root}/m")]
    commits = [w for w in sent if w.startswith("multi (") and f" ops, first: check {r.paths.columns})" in w]
    src = r.paths.replica(source)
    fetch_path = [w for w in sent if w == f"get_children {r.paths.replicas}" or f"{src.root}/" in w
                  or f"{me.root}/queue/" in w or f"{me.root}/parts/" in w or w in commits]
    # + the source's address once, + a few reads of the replica list and is_active by other tasks: one more
    # request per fetch is 20 more
    assert len(fetch_path) <= FETCH_PATH * N_PARTS + 4, Counter(fetch_path)
    per_fetch = (len(sent) - len(times)) / N_PARTS
    assert per_fetch <= MAX_PER_FETCH, (per_fetch, Counter(w.split(" ", 1)[0] for w in sent))
    # min_unprocessed_insert_time / max_processed_insert_time: written when an entry changes them, not
    # once more by every entry that finished meanwhile
    assert len(times) <= N_PARTS // 2, times
    assert len(commits) == N_PARTS  # one commit each
    # a fetched part's queue node goes in its commit's multi (replicad.replication.queue_finish); only the
    # entries that fetched nothing (a clone's log entries for parts it queued already) are removed apart
    removals = [w for w in sent if w.startswith(f"delete {me.root}/queue/") or (w.startswith("multi (")
                and f" ops, first: delete {me.root}/queue/" in w)]
    assert r.executor.removed_in_commit == N_PARTS
    assert len(removals) == r.executor.executed_total - N_PARTS, removals
    assert sent.count(f"get {r.paths.columns}") <= 1  # the version is the replica's (not read per fetch)
    assert sent.count(f"get {src.host}") <= 1  # the address is kept while its is_active is the same
    checksums = [w for w in sent if w.startswith(f"get {src.root}/parts/") and w.endswith("/checksums")]
    assert len(checksums) == N_PARTS == len(set(checksums))  # once per part
    assert not [w for w in sent if w.startswith(f"get {me.root}/parts/")]  # ours: the commit proves absence


async def check_insert_times(r: TableReplica) -> None:
    """The insert times the commits wrote, entries finishing together: ZooKeeper ends with the queue's own."""
    me = r.paths.me
    zk_times = [int((await r.keeper.get(path))[0]) for path in (me.min_unprocessed_insert_time,
                                                                   me.max_processed_insert_time)]
    state = r.queue_state
    assert zk_times == [state.min_unprocessed_insert_time, state.max_processed_insert_time], zk_times
    assert zk_times[0] == 0 and zk_times[1] > 0


async def test_new_replica_clones_with_a_bounded_number_of_requests_per_fetch(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, held = Requests(monkeypatch), HeldFetches(monkeypatch)
    r1 = await cluster.start("r1")
    held.free.add(id(r1.blockers))
    for block in one_row_parts(N_PARTS):
        await r1.insert_table(block)
    await wait_for(lambda: len(r1.queue_state) == 0, what="r1's own entries to be done")
    r2 = await cluster.start("r2")  # a new replica: clones r1 (one GET_PART per part, no source named)
    sent = await fetch_all(r2, held, requests)
    check_costs(sent, r2, "r1")
    assert await r2.count(None) == N_PARTS
    await check_insert_times(r2)


async def test_backlog_drains_with_a_bounded_number_of_requests_per_fetch(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, held = Requests(monkeypatch), HeldFetches(monkeypatch)
    r1 = await cluster.start("r1")
    held.free.add(id(r1.blockers))
    await cluster.start("r2")
    await cluster.stop("r2")
    for block in one_row_parts(N_PARTS):
        await r1.insert_table(block)
    # r2 comes back to a backlog (each entry names r1 as its source): too many entries for downloads started
    # as they are read or for source checks made then
    r2 = await cluster.start("r2")
    sent = await fetch_all(r2, held, requests)
    check_costs(sent, r2, "r1")
    assert await r2.count(None) == N_PARTS
    await check_insert_times(r2)
