"""Nemeses: faults injected into a :class:`tests.chaos.rig.Rig`, alone or in a random schedule from a seed.

Each nemesis has ``inject(rig, rng)`` (returns a description of what it did) and ``heal(rig)``.  The loopback
nemeses (process faults, flipped bytes, ZooKeeper node faults) work everywhere; ``disk_full`` needs the data
directories on tmpfs; partitions and slow links need network namespaces (:mod:`tests.chaos.netns`).  This
kernel has no netem: a tbf rate limit stands in for a slow link, and link delay/loss/reorder go through a
userspace packet queue (:mod:`tests.chaos.linkfaults`).  Clock skew between replicas: :mod:`tests.chaos.clock`
(libfaketime).  Both register in ``ALL_NEMESES`` from :mod:`tests.chaos.scenarios`.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.checker import Flip
from tests.chaos.disk import disk_parts, maximal, parse_part
from tests.chaos.netns import Network
from tests.chaos.rig import SESSION_TIMEOUT_S, Rig
from tests.chaos.workload import CHECKED_PARTITIONS


class Nemesis:
    name = "nemesis"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        raise NotImplementedError

    def heal(self, rig: Rig) -> None:
        rig.heal()


class KillOne(Nemesis):
    name = "kill_one"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice([n for n in rig.names if rig.running(n)])
        rig.kill(victim)
        return f"kill -9 {victim}"


class KillAll(Nemesis):
    name = "kill_all"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        for n in rig.names:
            rig.kill(n)
        return "kill -9 every replica"


class PauseOne(Nemesis):
    """SIGSTOP past the ZooKeeper session timeout: the session expires while the process sleeps."""

    name = "pause_one"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice([n for n in rig.names if rig.running(n)])
        rig.pause(victim)
        time.sleep(SESSION_TIMEOUT_S + 2)
        return f"SIGSTOP {victim} for more than {SESSION_TIMEOUT_S} s"


class ZkRestart(Nemesis):
    name = "zk_restart"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        leader = rig.ensemble.leader()
        i = rng.choice([k for k in range(len(rig.ensemble.nodes)) if k != leader])
        rig.ensemble.kill(i)
        return f"ZooKeeper node {i + 1} (a follower) killed"


class ZkLeaderKill(Nemesis):
    name = "zk_leader_kill"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        leader = rig.ensemble.leader()
        if leader is None:
            return "no ZooKeeper leader to kill"
        rig.ensemble.kill(leader)
        return f"ZooKeeper leader (node {leader + 1}) killed"


@dataclass
class FlipPart(Nemesis):
    """Stop a replica, flip one byte in a ``.bin`` file of one of its served parts, start it again."""

    flips: list[Flip] = field(default_factory=list)
    name = "flip_part"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice([n for n in rig.replicad_names if rig.running(n)])
        rig.kill(victim)
        flip = flip_byte(rig, victim, rng)
        if flip is None:
            return f"kill -9 {victim} (no part to flip)"
        self.flips.append(flip)
        return f"kill -9 {victim}, flipped byte {flip.offset} of {flip.part}/{flip.file}"


def flip_byte(rig: Rig, replica: str, rng: random.Random, part: str | None = None) -> Flip | None:
    """Flip a byte inside the compressed data of a ``.bin`` file (the replica must be stopped)."""
    table_dir = rig.table_dir(replica)
    if part is None:
        candidates = sorted(p for p in maximal(disk_parts(table_dir))
                            if (pp := parse_part(p)) and pp[0] in {str(x) for x in CHECKED_PARTITIONS})
        if not candidates:
            return None
        part = rng.choice(candidates)
    bins = sorted(f for f in (table_dir / part).iterdir() if f.suffix == ".bin" and f.stat().st_size > 30)
    if not bins:
        return None
    f = rng.choice(bins)
    return flip_file_byte(replica, part, f, rng)


def flip_file_byte(replica: str, part: str, path: Path, rng: random.Random) -> Flip:
    data = bytearray(path.read_bytes())
    before = hashlib.sha256(data).hexdigest()
    offset = rng.randrange(25, len(data))  # past the block checksum and header: inside the payload
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    return Flip(replica, part, path.name, offset, before, hashlib.sha256(data).hexdigest())


class DiskFull(Nemesis):
    """Fill one replica's data tmpfs to the last byte; the heal deletes the filler."""

    name = "disk_full"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice([n for n in rig.replicad_names if rig.running(n)])
        filler = rig.base / victim / "data" / "chaos-filler.bin"
        self.filler = filler
        if filler.parent not in rig.mounts:  # never fill a real disk
            return f"{victim}'s data is not on a tmpfs: disk_full skipped"
        written = 0
        with open(filler, "wb") as f:
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range(4096):  # bounded: 4 GiB at most
                    f.write(chunk)
                    f.flush()
                    written += len(chunk)
            except OSError:
                pass
        return f"filled {victim}'s data disk ({written >> 20} MiB)"

    def heal(self, rig: Rig) -> None:
        self.filler.unlink(missing_ok=True)
        rig.heal()


class ReplicaNetworkFault(Nemesis):
    """A network fault around one replica picked at random (:meth:`apply` makes it, says what it did)."""

    def inject(self, rig: Rig, rng: random.Random) -> str:
        assert rig.net is not None
        return self.apply(rig, rig.net, rng.choice(rig.names))

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        raise NotImplementedError


class PartitionInterserver(ReplicaNetworkFault):
    """One replica cut from the others' interserver addresses, both ways (ZooKeeper and clients still reach
    it)."""

    name = "partition_interserver"

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        for other in rig.names:
            if other != victim:
                net.cut(victim, net.inter_ip(other))
                net.cut(other, net.inter_ip(victim))
        return f"{victim} <-> other replicas cut on the interserver port"


class AsymmetricInterserver(ReplicaNetworkFault):
    """Packets from one replica to the others' interserver addresses vanish; the other direction works (for
    TCP that still breaks both ways, but only the victim's side drops)."""

    name = "asymmetric_interserver"

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        for other in rig.names:
            if other != victim:
                net.cut(victim, net.inter_ip(other))
        return f"{victim} -> other replicas' interserver port cut (one direction)"


class PartitionZooKeeper(ReplicaNetworkFault):
    name = "partition_zookeeper"

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        for node in rig.ensemble.nodes:
            net.cut(victim, node.host)
        return f"{victim} cut from every ZooKeeper node"


class ZkMinority(Nemesis):
    """One ZooKeeper node cut from the other two (a minority of one): it stops serving its clients."""

    name = "zk_minority"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        assert rig.net is not None
        i = rng.randrange(len(rig.ensemble.nodes))
        member = f"zk{i + 1}"
        for k, node in enumerate(rig.ensemble.nodes):
            if k != i:
                rig.net.cut(member, node.host)
                rig.net.cut(f"zk{k + 1}", rig.ensemble.nodes[i].host)
        return f"ZooKeeper node {i + 1} split from the majority"


class IsolateReplica(ReplicaNetworkFault):
    name = "isolate_replica"

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        net.link_down(victim)
        return f"{victim}'s link down (cut from everything)"


class SlowLink(ReplicaNetworkFault):
    name = "slow_link"

    def apply(self, rig: Rig, net: Network, victim: str) -> str:
        net.slow(victim)
        return f"{victim}'s link slowed to 256 kbit/s with a 500 ms queue"


LOOPBACK_NEMESES: dict[str, type[Nemesis]] = {
    n.name: n for n in (KillOne, KillAll, PauseOne, ZkRestart, ZkLeaderKill, FlipPart)
}
DISK_NEMESES: dict[str, type[Nemesis]] = {DiskFull.name: DiskFull}
NETWORK_NEMESES: dict[str, type[Nemesis]] = {
    n.name: n for n in (PartitionInterserver, AsymmetricInterserver, PartitionZooKeeper, ZkMinority,
                        IsolateReplica, SlowLink)
}
ALL_NEMESES = {**LOOPBACK_NEMESES, **DISK_NEMESES, **NETWORK_NEMESES}


@dataclass
class Event:
    nemesis: str
    what: str
    at_s: float
    held_s: float


def run_schedule(rig: Rig, rng: random.Random, names: Sequence[str], t0: float,
                 hold: tuple[float, float] = (2.0, 6.0), quiet: tuple[float, float] = (1.0, 3.0),
                 flipper: FlipPart | None = None) -> list[Event]:
    """Inject the nemeses ``names`` one after the other (hold, heal, quiet); returns what happened."""
    events = []
    flipper = flipper or FlipPart()
    for name in names:
        nemesis: Nemesis = flipper if name == "flip_part" else ALL_NEMESES[name]()
        start = time.monotonic()
        what = nemesis.inject(rig, rng)
        held = rng.uniform(*hold)
        time.sleep(held)
        nemesis.heal(rig)
        events.append(Event(name, what, round(start - t0, 1), round(time.monotonic() - start, 1)))
        time.sleep(rng.uniform(*quiet))
    return events


def random_schedule(rng: random.Random, n: int, available: Sequence[str] | None = None) -> list[str]:
    return [rng.choice(sorted(available or LOOPBACK_NEMESES)) for _ in range(n)]
