"""The independent checker: judges a run from the outside, never through replicad's code.

It reads rows through the HTTP API (``SELECT``, ``/status``), the replicas' state in ZooKeeper directly
(kazoo), and part directories on disk (``checksums.txt`` bytes and SHA-256 of every file).
``import replicad`` never happens here (a test asserts it).  After the heal it verifies:

* ``drain``      every replica active, log pulled, queue empty within 60 s of the heal (recovery time kept);
* ``readonly``   no replica read-only once ZooKeeper is back;
* ``lost``       every acknowledged row of the checked partitions is on every replica;
* ``dedup_absent`` an insert answered "deduplicated" has its rows present;
* ``duplicate``  no id twice on a replica (retries reuse the dedup token); ``partial``: an insert is all or
                 nothing; ``phantom``: no id nobody inserted;
* ``quorum``     an insert acknowledged with quorum 2 had its rows on a second replica right away;
* ``diverged``   replicas hold the same parts (ZooKeeper and disk agree), byte-identical ``checksums.txt`` and
                 data files, and the same rows;
* ``mutation``   every mutation has rewritten every part below its block number (within 60 s of the heal);
* ``intersect``  part block ranges of a partition nest or are disjoint, never overlap;
* ``corruption`` bytes flipped by the nemesis are not served or copied anywhere once healed, and the broken
                 part went to ``detached/`` (never deleted).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.disk import covers, disk_parts, file_digests, maximal, minimal_checksums, parse_part
from tests.chaos.workload import CHECKED_PARTITIONS, TABLE, InsertOp, http_query

DRAIN_LIMIT_S = 60.0


@dataclass(frozen=True)
class ReplicaView:
    name: str
    url: str
    table_dir: Path
    clickhouse: bool = False  # a ClickHouse 18.16 server: its state comes from system tables


@dataclass(frozen=True)
class Flip:
    """One byte the nemesis flipped in ``replica``'s ``part/file`` while it was stopped."""

    replica: str
    part: str
    file: str
    offset: int
    sha_before: str
    sha_after: str


@dataclass
class Verdict:
    violations: list[tuple[str, str]] = field(default_factory=list)
    recovery_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, detail: str) -> None:
        self.violations.append((kind, detail))

    def kinds(self) -> set[str]:
        return {k for k, _ in self.violations}


# ---- ZooKeeper -------------------------------------------------------------------------------------------


class ZkView:
    def __init__(self, hosts: str, table_path: str) -> None:
        from kazoo.client import KazooClient

        self.table_path = table_path
        self.zk = KazooClient(hosts=hosts, timeout=10)
        self.zk.start(30)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return list(self.zk.get_children(self.table_path + path))
        except NoNodeError:
            return []

    def get(self, path: str) -> bytes | None:
        from kazoo.exceptions import NoNodeError

        try:
            return bytes(self.zk.get(self.table_path + path)[0])
        except NoNodeError:
            return None

    def replica_lag(self, replica: str) -> str | None:
        """None when ``replica`` is active, has pulled the whole log and has an empty queue; else why not."""
        if self.get(f"/replicas/{replica}/is_active") is None:
            return "not active"
        logs = [int(c[4:]) for c in self.children("/log") if c.startswith("log-")]
        raw = self.get(f"/replicas/{replica}/log_pointer") or b""
        pointer = int(raw) if raw.strip() else 0
        if logs and pointer <= max(logs):
            return f"log_pointer {pointer} <= last log entry {max(logs)}"
        queue = sorted(self.children(f"/replicas/{replica}/queue"))
        if queue:
            first = (self.get(f"/replicas/{replica}/queue/{queue[0]}") or b"").decode("utf-8", "replace")
            kind = next((ln for ln in first.split("\n")[3:6] if ln and not ln.startswith("source")), "?")
            return f"{len(queue)} queue entries ({queue[0]}: {kind})"
        return None

    def mutation_blocks(self) -> dict[str, dict[str, int]]:
        """mutation znode -> {partition id: block number} (from the 18.16 text of ``mutations/<n>``)."""
        out = {}
        for name in sorted(self.children("/mutations")):
            raw = self.get(f"/mutations/{name}")
            if raw is None:
                continue
            lines = raw.decode("utf-8", "replace").split("\n")
            count = next(int(x.split(": ", 1)[1]) for x in lines if x.startswith("block numbers count: "))
            start = next(i for i, x in enumerate(lines) if x.startswith("block numbers count: ")) + 1
            out[name] = {pid: int(n) for pid, n in (x.split("\t") for x in lines[start:start + count])}
        return out


def mutations_pending(zk: ZkView, served: dict[str, set[str]]) -> list[str]:
    """Served parts that a mutation should have rewritten: part blocks below the mutation's block number in
    its partition, data version below it."""
    out = []
    # ClickHouse never mutates the latest part of a partition inserted with quorum (quorum/last_part): the
    # mutation waits for the next quorum insert there.  Such a part is not counted as left behind.
    raw_last = (zk.get("/quorum/last_part") or b"").decode("utf-8", "replace")
    last_quorum = set(re.findall(r"[^\s_]+_\d+_\d+_\d+(?:_\d+)?", raw_last))
    for mutation, blocks in zk.mutation_blocks().items():
        for replica, parts in served.items():
            for part in sorted(parts):
                pp = parse_part(part)
                if pp is None or pp[0] not in blocks or part in last_quorum:
                    continue
                version = pp[4] or pp[1]
                if pp[1] < blocks[pp[0]] and version < blocks[pp[0]]:
                    out.append(f"{replica}: {part} not rewritten by mutation {mutation} "
                               f"(block {blocks[pp[0]]})")
    return out


# ---- the checks ------------------------------------------------------------------------------------------


def quorum_probe(urls: dict[str, str], op: InsertOp) -> str:
    """Right after a quorum-2 ack: another replica must already have the rows."""
    if op.partition not in CHECKED_PARTITIONS:
        return "unverified"
    sql = f"SELECT count() FROM {TABLE} WHERE id >= {min(op.ids)} AND id <= {max(op.ids)}"
    answered = 0
    for name, url in urls.items():
        if name == op.acked_by:
            continue
        try:
            status, _h, body = http_query(url, sql, timeout=3.0)
        except (OSError, http.client.HTTPException):
            continue
        if status != 200:
            continue
        answered += 1
        if int(body.strip() or 0) >= len(op.ids):
            return "ok"
    if answered == len(urls) - 1:
        return f"no other replica has batch {op.token} (acked by {op.acked_by} with quorum 2)"
    return "unverified"


def wait_drained(zk: ZkView, replicas: Sequence[ReplicaView], until: float) -> dict[str, str]:
    """Waits until every replica is caught up or ``until``; returns the replicas still lagging (and why)."""
    while True:
        lag = {}
        for r in replicas:
            why = zk.replica_lag(r.name)
            status = _status(r)
            if why is None and (status is None or status.get("is_readonly")):
                why = "read-only or not answering /status"
            if why is not None and status is not None:
                why += f" (its /status: queue_size {status.get('queue_size')})"
            if why is not None:
                lag[r.name] = why
        if not lag or time.monotonic() > until:
            return lag
        time.sleep(0.3)


def _readonly(r: ReplicaView) -> bool | None:
    status = _status(r)
    return None if status is None else bool(status.get("is_readonly"))


def _get_json(r: ReplicaView, path: str) -> object | None:
    parsed = urllib.parse.urlsplit(r.url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=10.0)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def _sql_lines(r: ReplicaView, sql: str) -> list[str] | None:
    try:
        status, _h, body = http_query(r.url, sql, timeout=10.0)
    except (OSError, http.client.HTTPException):
        return None
    return body.decode("utf-8", "replace").splitlines() if status == 200 else None


def _status(r: ReplicaView) -> dict[str, object] | None:
    if r.clickhouse:
        lines = _sql_lines(r, "SELECT is_readonly, queue_size FROM system.replicas "
                              "WHERE database = 'db' AND table = 't' FORMAT TabSeparated")
        if not lines:
            return None
        readonly, queue = lines[0].split("\t")
        return {"is_readonly": readonly == "1", "queue_size": int(queue)}
    body = _get_json(r, "/status")
    try:
        return dict(body["tables"][TABLE])  # type: ignore[index]
    except (TypeError, KeyError):
        return None


def served_parts(r: ReplicaView) -> set[str]:
    """The parts ``r`` serves (its HTTP parts listing, ``active``); the maximal directories on disk when it
    does not answer.  Outdated parts stay on disk a while: the disk alone cannot tell."""
    if r.clickhouse:
        lines = _sql_lines(r, "SELECT name FROM system.parts WHERE database = 'db' AND table = 't' "
                              "AND active FORMAT TabSeparated")
        return set(lines) if lines is not None else maximal(disk_parts(r.table_dir))
    body = _get_json(r, f"/tables/{TABLE}/parts")
    if isinstance(body, list):
        return {str(p["name"]) for p in body if isinstance(p, dict) and p.get("active")}
    return maximal(disk_parts(r.table_dir))


def read_rows(r: ReplicaView, attempts: int = 5) -> list[tuple[int, int, int, int]] | str:
    """Every row ``(p, id, client, v)`` on ``r``, sorted; or the last error text."""
    last = ""
    for _ in range(attempts):
        try:
            status, _h, body = http_query(r.url, f"SELECT p, id, client, v FROM {TABLE} FORMAT TabSeparated",
                                          timeout=30.0)
        except (OSError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if status == 200:
                lines = body.decode("utf-8", "replace").splitlines()
                try:
                    rows = [tuple(int(x) for x in line.split("\t")) for line in lines if line]
                    return sorted(rows)  # type: ignore[arg-type]
                except ValueError:  # an exception after the first rows: the text ends the body, as ClickHouse
                    last = f"HTTP 200 ending in an error: {lines[-1][:200] if lines else ''}"
            else:
                last = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
        time.sleep(1.0)
    return last


def check(replicas: Sequence[ReplicaView], zk_hosts: str, table_path: str, inserts: Sequence[InsertOp],
          healed_at: float, flips: Sequence[Flip] = ()) -> Verdict:
    v = Verdict()
    zk = ZkView(zk_hosts, table_path)
    try:
        _check(v, zk, replicas, inserts, healed_at, flips)
    finally:
        zk.close()
    return v


def _check(v: Verdict, zk: ZkView, replicas: Sequence[ReplicaView], inserts: Sequence[InsertOp],
           healed_at: float, flips: Sequence[Flip]) -> None:
    lag = wait_drained(zk, replicas, healed_at + DRAIN_LIMIT_S)
    if lag:
        v.add("drain", f"not caught up {DRAIN_LIMIT_S:.0f} s after the heal: {lag}")
        lag = wait_drained(zk, replicas, time.monotonic() + 30)  # keep judging with what we have
    else:
        v.recovery_s = round(time.monotonic() - healed_at, 2)
    for r in replicas:
        if _readonly(r):
            v.add("readonly", f"{r.name} is read-only after the heal")
    pending: list[str] = []

    def mutated() -> bool:
        pending[:] = mutations_pending(zk, {r.name: served_parts(r) for r in replicas})
        return not pending

    deadline = max(healed_at + DRAIN_LIMIT_S, time.monotonic() + 5)
    while not mutated() and time.monotonic() < deadline:
        time.sleep(0.5)
    if pending:
        v.add("mutation", f"{len(pending)} parts left behind by mutations, e.g. {pending[0]}")
    status = zk.get("/quorum/status")
    if status is not None:
        text = status.decode("utf-8", "replace")[:200]
        v.add("quorum", f"quorum/status still exists after the heal: {text}")

    _check_spread(v, replicas, flips)
    # rows first: reading every column makes a replica notice a corrupted part (then it is re-fetched)
    rows = {r.name: read_rows(r) for r in replicas}
    if any(isinstance(x, str) for x in rows.values()) or flips:
        wait_drained(zk, replicas, time.monotonic() + 30)
        rows = {r.name: read_rows(r) for r in replicas}
    # the parts are read again after the settle: a merge the leader assigns in between leaves the replicas a
    # merge apart in that reading (seen in CI: all three merged the same six parts within 40 ms, one read
    # before its merge); a difference that holds over three settles is judged
    for attempt in range(3):
        _settle_parts(zk, replicas, time.monotonic() + (15 if attempt == 0 else 10))
        parts = Verdict()
        _check_parts(parts, zk, replicas, flips)
        if not _only_parts_apart(parts):
            break
    v.violations += parts.violations
    v.notes += parts.notes
    _check_rows(v, rows, inserts)
    for op in inserts:
        if op.quorum > 1 and op.quorum_probe not in ("", "ok", "unverified"):
            v.add("quorum", op.quorum_probe)


def _check_rows(v: Verdict, rows: dict[str, list[tuple[int, int, int, int]] | str],
                inserts: Sequence[InsertOp]) -> None:
    by_id = {i: op for op in inserts for i in op.ids}
    readable = {}
    for name, got in rows.items():
        if isinstance(got, str):
            v.add("unreadable", f"{name}: SELECT failed after the heal: {got}")
        else:
            readable[name] = got
    for name, got in readable.items():
        counts = Counter(row[1] for row in got)
        dups = sorted(i for i, c in counts.items() if c > 1)
        if dups:
            v.add("duplicate", f"{name}: {len(dups)} ids more than once, e.g. {dups[0]} "
                               f"({by_id[dups[0]].token if dups[0] in by_id else 'unknown batch'})")
        phantom = sorted(i for i in counts if i not in by_id)
        if phantom:
            v.add("phantom", f"{name}: {len(phantom)} ids nobody inserted, e.g. {phantom[0]}")
        present = set(counts)
        lost_ops = []
        for op in inserts:
            have = sum(1 for i in op.ids if i in present)
            if op.partition in CHECKED_PARTITIONS and 0 < have < len(op.ids):
                v.add("partial", f"{name}: batch {op.token} has {have} of {len(op.ids)} rows")
            if op.status == "acked" and op.partition in CHECKED_PARTITIONS and have < len(op.ids):
                lost_ops.append(op)
        for op in lost_ops:
            kind = "dedup_absent" if op.deduplicated else "lost"
            v.add(kind, f"{name}: acked batch {op.token} (quorum {op.quorum}, acked by {op.acked_by}, "
                        f"{op.attempts} attempts) missing")
    names = sorted(readable)
    for other in names[1:]:
        if readable[other] != readable[names[0]]:
            a, b = set(readable[names[0]]), set(readable[other])
            v.add("diverged", f"rows of {names[0]} and {other} differ: {len(a - b)} only on {names[0]}, "
                              f"{len(b - a)} only on {other}")


def _only_parts_apart(v: Verdict) -> bool:
    """Whether every violation is replicas serving different parts (as a merge under way leaves them)."""
    return bool(v.violations) and all(kind == "diverged" and detail.startswith("parts of ")
                                      for kind, detail in v.violations)


def _settle_parts(zk: ZkView, replicas: Sequence[ReplicaView], until: float) -> None:
    """Merges go on after the heal (the leader assigns them as the mutations finish): a snapshot taken while
    one is under way sees replicas a merge apart.  Until ``until``, wait for the replicas to serve the same
    parts, each caught up with the log; what still differs then is judged by :func:`_check_parts`."""
    while time.monotonic() < until:
        if not wait_drained(zk, replicas, min(until, time.monotonic() + 5)):
            served = [served_parts(r) for r in replicas]
            if all(s == served[0] for s in served[1:]):
                return
        time.sleep(0.5)


def _check_parts(v: Verdict, zk: ZkView, replicas: Sequence[ReplicaView], flips: Sequence[Flip]) -> None:
    served: dict[str, set[str]] = {}
    for r in replicas:
        on_disk = disk_parts(r.table_dir)
        in_zk = [p for p in zk.children(f"/replicas/{r.name}/parts") if parse_part(p)]
        served[r.name] = served_parts(r)
        listed = maximal(in_zk)
        if listed != served[r.name]:
            v.add("diverged", f"{r.name}: ZooKeeper lists {sorted(listed - served[r.name])} not on disk, "
                              f"disk has {sorted(served[r.name] - listed)} not in ZooKeeper")
        _check_intersections(v, r.name, on_disk + in_zk)
    names = [r.name for r in replicas]
    for other in names[1:]:
        if served[other] != served[names[0]]:
            v.add("diverged", f"parts of {names[0]} and {other} differ: "
                              f"{sorted(served[names[0]] ^ served[other])}")
    digests: dict[str, dict[str, dict[str, str]]] = {}
    for r in replicas:
        for part in served[r.name]:
            try:
                digests.setdefault(part, {})[r.name] = file_digests(r.table_dir / part)
            except OSError:
                continue  # removed by a merge meanwhile
    for part, per_replica in sorted(digests.items()):
        seen = list(per_replica.items())
        for name, files in seen[1:]:
            if files == seen[0][1]:
                continue
            # Compressed bytes may differ (replicas merge and mutate on their own; another LZ4 implementation
            # compresses differently): ClickHouse only requires the same uncompressed contents.
            mine = minimal_checksums(next(r for r in replicas if r.name == name).table_dir / part)
            first = minimal_checksums(next(r for r in replicas if r.name == seen[0][0]).table_dir / part)
            if mine is not None and mine == first:
                v.notes.append(f"part {part}: {name} and {seen[0][0]} differ in compressed bytes only")
                continue
            differ = sorted(f for f in set(files) | set(seen[0][1]) if files.get(f) != seen[0][1].get(f))
            v.add("diverged", f"part {part}: files {differ} of {name} and {seen[0][0]} differ")
    flipped_shas = {f.sha_after: f for f in flips}
    for part, per_replica in digests.items():
        for name, files in per_replica.items():
            for fname, sha in files.items():
                f = flipped_shas.get(sha)
                if f is not None:
                    where = "still served by" if name == f.replica else "copied to"
                    v.add("corruption", f"{f.file} of {f.part} flipped on {f.replica} is {where} {name} "
                                        f"(as {part}/{fname})")
    for f in flips:
        r = next(x for x in replicas if x.name == f.replica)
        detached = r.table_dir / "detached"
        kept = detached.is_dir() and any(f.part in d.name for d in detached.iterdir())
        covered = any(covers(p, f.part) for p in served.get(f.replica, ()))
        if not kept and not covered:
            v.add("corruption", f"broken part {f.part} of {f.replica} was deleted, not moved to detached/")


def _check_spread(v: Verdict, replicas: Sequence[ReplicaView], flips: Sequence[Flip]) -> None:
    """Flipped bytes must never be accepted by another replica: not in its parts, not even in ``detached/``
    (a fetch that checks hashes discards a bad download before it becomes a part)."""
    if not flips:
        return
    bad = {f.sha_after: f for f in flips}
    for r in replicas:
        dirs = [r.table_dir / p for p in disk_parts(r.table_dir)]
        detached = r.table_dir / "detached"
        if detached.is_dir():
            dirs += [d for d in detached.iterdir() if d.is_dir()]
        for d in dirs:
            try:
                digests = file_digests(d)
            except OSError:
                continue
            for fname, sha in digests.items():
                f = bad.get(sha)
                if f is not None and f.replica != r.name:
                    v.add("corruption", f"{f.file} of {f.part} flipped on {f.replica} was copied to {r.name} "
                                        f"({d.relative_to(r.table_dir)}/{fname})")


def _check_intersections(v: Verdict, replica: str, names: Sequence[str]) -> None:
    parsed = sorted({(p[0], p[1], p[2], n) for n in set(names) if (p := parse_part(n))})
    for i, (part_a, lo_a, hi_a, a) in enumerate(parsed):
        for part_b, lo_b, hi_b, b in parsed[i + 1:]:
            if part_b != part_a or lo_b > hi_a:
                continue
            nested = (lo_a <= lo_b and hi_b <= hi_a) or (lo_b <= lo_a and hi_a <= hi_b)
            if not nested:
                v.add("intersect", f"{replica}: parts {a} and {b} intersect")
