"""Network namespaces for the rig: one per ZooKeeper node and per replica, joined by a bridge.

    net = Network(["zk1", "zk2", "zk3", "r1", "r2", "r3"])
    net.setup()                       # RuntimeError (with the reason) when namespaces cannot be built
    net.ip("r1"), net.inter_ip("r1")  # 10.X.0.k (ZooKeeper, HTTP API) and 10.X.1.k (interserver only)
    net.prefix("r1")                  # ["ip", "netns", "exec", <ns>]: run a process inside
    net.cut("r1", "10.X.1.12")        # blackhole route in r1's namespace; net.heal() removes every fault
    net.teardown()

Each member has two addresses on its veth: the first for ZooKeeper and the HTTP API, the second for the
interserver port only, so a route to the second cuts replica<->replica fetches and nothing else (this kernel
has no netem, prio qdisc or tc drop actions; routes, link state and tbf work).  The root namespace owns the
bridge (10.X.0.1 and 10.X.1.1): the workload and the checker reach every member from there.  Traffic never
leaves the machine: the subnet is not routed anywhere.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
from collections.abc import Sequence

from replicad.devtools.ports import worker_share


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Network:
    def __init__(self, members: Sequence[str]) -> None:
        self.members = list(members)
        self.tag = f"{random.randrange(16**4):04x}"
        index, count = worker_share()  # concurrent test workers never draw the same subnet
        self.octet = random.randrange(100 + index, 250, count)
        self.bridge = f"chb{self.tag}"
        self.cuts: set[tuple[str, str]] = set()
        self.down: set[str] = set()
        self.slowed: set[str] = set()
        self._made_ns: list[str] = []
        self._made_bridge = False

    def ns(self, member: str) -> str:
        return f"chaos-{self.tag}-{member}"

    def veth(self, member: str) -> str:
        return f"chv{self.tag}{self.members.index(member)}"

    def ip(self, member: str) -> str:
        return f"10.{self.octet}.0.{10 + self.members.index(member)}"

    def inter_ip(self, member: str) -> str:
        return f"10.{self.octet}.1.{10 + self.members.index(member)}"

    def prefix(self, member: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(member)]

    def setup(self) -> None:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"10.{self.octet}.0.1/24", "dev", self.bridge)
            _ip("addr", "add", f"10.{self.octet}.1.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for m in self.members:
                ns = self.ns(m)
                _ip("netns", "add", ns)
                self._made_ns.append(ns)
                _ip("link", "add", self.veth(m), "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", self.veth(m), "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.ip(m)}/24", "dev", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.inter_ip(m)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.teardown()
            raise

    def teardown(self) -> None:
        for ns in self._made_ns:
            _ip("netns", "del", ns, check=False)
        self._made_ns = []
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._made_bridge = False

    # ---- faults

    def cut(self, member: str, dst_ip: str) -> None:
        """Packets from ``member`` to ``dst_ip`` vanish (a blackhole route in its namespace)."""
        _ip("-n", self.ns(member), "route", "add", "blackhole", f"{dst_ip}/32")
        self.cuts.add((member, dst_ip))

    def link_down(self, member: str) -> None:
        _ip("link", "set", self.veth(member), "down")
        self.down.add(member)

    def slow(self, member: str, rate: str = "256kbit") -> None:
        """A slow link towards ``member`` (tbf: rate limit with a 500 ms queue)."""
        argv = ["tc", "qdisc", "add", "dev", self.veth(member), "root", "tbf", "rate", rate,
                "burst", "16kbit", "latency", "500ms"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise RuntimeError(f"tc tbf: {r.stderr.strip()}")
        self.slowed.add(member)

    def heal(self) -> None:
        for member, dst in sorted(self.cuts):
            _ip("-n", self.ns(member), "route", "del", "blackhole", f"{dst}/32", check=False)
        self.cuts.clear()
        for member in sorted(self.down):
            _ip("link", "set", self.veth(member), "up", check=False)
        self.down.clear()
        for member in sorted(self.slowed):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["tc", "qdisc", "del", "dev", self.veth(member), "root"], capture_output=True,
                               timeout=20)
        self.slowed.clear()
