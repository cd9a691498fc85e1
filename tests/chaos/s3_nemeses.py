"""Nemeses of an S3 run (the table on an S3 disk, zero-copy replication; see :mod:`tests.chaos.s3_member`).

* ``partition_s3``  one replica cut from the S3 endpoint (a blackhole route; network namespaces only);
* ``pause_s3``      the S3 server stopped (SIGSTOP) for the hold: every replica's requests hang;
* ``kill_merging``  an OPTIMIZE FINAL, and kill -9 of the replica holding the merge's ``part_exclusive_lock``
                    (the one making the shared merged part) as soon as ZooKeeper shows it;
* ``wipe_local``    kill -9 of a replica and removal of the local copies of its parts: it reads them back
                    from the bucket through its metadata when it starts again.

They reach the S3 member through ``rig.s3`` and join :data:`tests.chaos.nemeses.ALL_NEMESES` on import.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Sequence

from tests.chaos.disk import disk_parts
from tests.chaos.nemeses import ALL_NEMESES, Nemesis
from tests.chaos.rig import TABLE_ZK_PATH, Rig
from tests.chaos.s3_checker import EXCLUSIVE_LOCK, zero_copy_base
from tests.chaos.workload import CHECKED_PARTITIONS, TABLE, http_query


class PartitionS3(Nemesis):
    name = "partition_s3"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        assert rig.net is not None and rig.s3 is not None
        victim = rng.choice(rig.replicad_names)
        rig.net.cut(victim, rig.s3.host)
        return f"{victim} cut from the S3 endpoint"


class PauseS3(Nemesis):
    name = "pause_s3"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        assert rig.s3 is not None
        rig.s3.pause()
        return "S3 server stopped (SIGSTOP)"

    def heal(self, rig: Rig) -> None:
        rig.s3.resume()
        rig.heal()


class KillMerging(Nemesis):
    """OPTIMIZE … FINAL on a random replica; the replica that takes the merged part's exclusive lock is
    killed the moment the lock is seen (polled for 5 s; without one, the replica asked is killed)."""

    name = "kill_merging"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError

        running = [n for n in rig.replicad_names if rig.running(n)]
        if not running:
            return "no replica running to merge"
        asked = rng.choice(running)
        partition = rng.choice(CHECKED_PARTITIONS)
        zk = KazooClient(hosts=rig.ensemble.hosts, timeout=10)
        zk.start(30)
        try:
            base = zero_copy_base(zk, rig.chroot, TABLE_ZK_PATH)
            seen = set(zk.get_children(base)) if base and zk.exists(base) else set()

            def optimize() -> None:
                try:
                    http_query(rig.url(asked), f"OPTIMIZE TABLE {TABLE} PARTITION {partition} FINAL",
                               timeout=15)
                except OSError:
                    pass

            threading.Thread(target=optimize, daemon=True).start()
            deadline = time.monotonic() + 5.0
            while base and time.monotonic() < deadline:
                try:
                    parts = set(zk.get_children(base))
                except NoNodeError:
                    break
                for part in sorted(parts - seen):
                    try:
                        holder = bytes(zk.get(f"{base}/{part}/{EXCLUSIVE_LOCK}")[0]).decode()
                    except NoNodeError:
                        continue
                    if holder in rig.replicad_names and rig.running(holder):
                        rig.kill(holder)
                        return f"kill -9 {holder} holding the exclusive lock of merged part {part}"
                seen |= {p for p in parts - seen if not p.startswith(f"{partition}_")}
                time.sleep(0.005)
        finally:
            zk.stop()
            zk.close()
        rig.kill(asked)
        return f"no exclusive lock seen within 5 s: kill -9 {asked} (asked to merge partition {partition})"


class WipeLocal(Nemesis):
    name = "wipe_local"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice(rig.replicad_names)
        rig.kill(victim)
        table_dir = rig.table_dir(victim)
        parts = disk_parts(table_dir)
        for p in parts:
            shutil.rmtree(table_dir / p, ignore_errors=True)
        return f"kill -9 {victim}, removed the local copies of its {len(parts)} part directories"


S3_NEMESES: dict[str, type[Nemesis]] = {n.name: n for n in (PauseS3, KillMerging, WipeLocal)}
S3_NETWORK_NEMESES: dict[str, type[Nemesis]] = {PartitionS3.name: PartitionS3}
ALL_NEMESES.update(S3_NEMESES)
ALL_NEMESES.update(S3_NETWORK_NEMESES)


def available(network: bool) -> list[str]:
    return sorted([*S3_NEMESES, *(S3_NETWORK_NEMESES if network else ())])


def schedule(rng: random.Random, n: int, others: Sequence[str], network: bool) -> list[str]:
    """``n`` nemeses among ``others`` and the S3 ones, at least one of them an S3 nemesis."""
    s3 = available(network)
    names = [rng.choice(sorted({*others, *s3})) for _ in range(n)]
    if n and not set(names) & set(s3):
        names[rng.randrange(n)] = rng.choice(s3)
    return names
