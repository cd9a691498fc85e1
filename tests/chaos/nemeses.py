"""Nemeses: faults injected into a :class:`tests.chaos.rig.Rig`, alone or in a random schedule from a seed.

Each nemesis has ``inject(rig, rng)`` (returns a description of what it did) and ``heal(rig)``.  The loopback
nemeses (process and disk faults, ZooKeeper node faults) work everywhere; partitions and netem need network
namespaces, which this rig does not build yet (see :func:`tests.chaos.rig.netns_support`).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.checker import Flip, disk_parts, maximal, parse_part
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
        victim = rng.choice([n for n in rig.names if rig.running(n)])
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


LOOPBACK_NEMESES: dict[str, type[Nemesis]] = {
    n.name: n for n in (KillOne, KillAll, PauseOne, ZkRestart, ZkLeaderKill, FlipPart)
}


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
        nemesis: Nemesis = flipper if name == "flip_part" else LOOPBACK_NEMESES[name]()
        start = time.monotonic()
        what = nemesis.inject(rig, rng)
        held = rng.uniform(*hold)
        time.sleep(held)
        nemesis.heal(rig)
        events.append(Event(name, what, round(start - t0, 1), round(time.monotonic() - start, 1)))
        time.sleep(rng.uniform(*quiet))
    return events


def random_schedule(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(sorted(LOOPBACK_NEMESES)) for _ in range(n)]
