"""Link faults without netem: delay, loss and reorder on one member's link (a replica or a ZooKeeper node).

This kernel has no netem qdisc.  What it has: the iptables ``NFQUEUE`` target (through the nf_tables compat
layer) and ``nfnetlink_queue``, so every packet in and out of the victim's ``eth0`` (its only link: ZooKeeper,
interserver and client traffic alike) is handed to :mod:`tests.chaos.linkqueue`, a userspace program in the
victim's namespace that holds each packet for a delay, drops a fraction and lets some overtake others: real
delay, loss and reorder on the wire, with TCP retransmitting and reassembling as it would over a bad link.

    mode, reason = link_fault_support()   # "nfqueue" | "nft-loss" | None, and why not better
    fault = QueuedLink(net, "r2", delay_ms=100, jitter_ms=50, seed=3).start()
    fault.stop()                           # rules removed first, then every held packet let through

Where NFQUEUE is missing but nftables works, only loss is possible (``numgen random mod 100 < N drop``),
and ``link_delay`` / ``link_reorder`` are left out of the schedules; without either there are no link
nemeses (the suite says so in RELIABILITY.md's header line).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.chaos.nemeses import Nemesis
from tests.chaos.netns import Network
from tests.chaos.rig import Rig

REPO = Path(__file__).resolve().parents[2]
QUEUE_NUM = 7
HANDLER_MAX_S = 180  # the handler exits by itself after this, whatever happens to the suite
NFT_TABLE = "chaoslink"
_support: tuple[str | None, str | None] | None = None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def _rules(ns: str, op: str) -> None:
    prefix = ["ip", "netns", "exec", ns, "iptables"]
    for chain, iface in (("OUTPUT", "-o"), ("INPUT", "-i")):
        _run([*prefix, op, chain, iface, "eth0", "-j", "NFQUEUE", "--queue-num", str(QUEUE_NUM),
              "--queue-bypass"], check=op == "-A")


def _probe() -> tuple[str | None, str | None]:
    ns = f"chaos-probe-{uuid.uuid4().hex[:6]}"
    try:
        _run(["ip", "netns", "add", ns])
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"no network namespaces: {e}"
    try:
        nfq_reason = None
        if shutil.which("iptables") is None:
            nfq_reason = "no iptables (Debian package iptables)"
        else:
            try:
                _rules(ns, "-A")
                code = f"from tests.chaos.linkqueue import Queue; Queue({QUEUE_NUM}).close()"
                _run(["ip", "netns", "exec", ns, sys.executable, "-c", code], check=True)
                return "nfqueue", None
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                nfq_reason = f"NFQUEUE unusable: {str(e).splitlines()[-1] if str(e) else e}"
        if shutil.which("nft") is None:
            return None, f"{nfq_reason}; no nft (Debian package nftables)"
        try:
            _nft_loss(ns, 1)
            return "nft-loss", nfq_reason
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            return None, f"{nfq_reason}; nft drop rules unusable: {e}"
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def link_fault_support() -> tuple[str | None, str | None]:
    """("nfqueue", None): delay, loss and reorder; ("nft-loss", why): loss only; (None, why): none.  Probed
    once per process in a scratch namespace."""
    global _support
    if _support is None:
        _support = _probe()
    return _support


def _nft_loss(ns: str, percent: int) -> None:
    nft = ["ip", "netns", "exec", ns, "nft"]
    _run([*nft, "add", "table", "inet", NFT_TABLE])
    for chain, hook, iface in (("out", "output", "oifname"), ("in", "input", "iifname")):
        _run([*nft, "add", "chain", "inet", NFT_TABLE, chain, f"{{ type filter hook {hook} priority 0; }}"])
        _run([*nft, "add", "rule", "inet", NFT_TABLE, chain, iface, "eth0", "numgen", "random", "mod", "100",
              "<", str(percent), "drop"])


class QueuedLink:
    """Every packet through ``member``'s eth0 goes through a :mod:`tests.chaos.linkqueue` handler."""

    def __init__(self, net: Network, member: str, *, delay_ms: float = 0.0, jitter_ms: float = 0.0,
                 loss: float = 0.0, reorder: float = 0.0, reorder_ms: float = 50.0, seed: int = 0) -> None:
        self.net, self.member = net, member
        self.args = ["--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms), "--loss", str(loss),
                     "--reorder", str(reorder), "--reorder-ms", str(reorder_ms), "--seed", str(seed)]
        self.proc: subprocess.Popen[str] | None = None
        self.counts = ""

    def start(self) -> QueuedLink:
        argv = [*self.net.prefix(self.member), sys.executable, "-m", "tests.chaos.linkqueue", "--queue",
                str(QUEUE_NUM), "--seconds", str(HANDLER_MAX_S), *self.args]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "ready" once bound (or the error and EOF)
        if line.strip() != "ready":
            rest = self.proc.stdout.read() if self.proc.wait(timeout=10) is not None else ""
            raise RuntimeError(f"linkqueue in {self.member} did not start: {line}{rest}")
        _rules(self.net.ns(self.member), "-A")
        return self

    def stop(self) -> str:
        _rules(self.net.ns(self.member), "-D")
        if self.proc is not None:
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate(timeout=10)
            self.counts = out.strip().splitlines()[-1] if out.strip() else ""
            self.proc = None
        return self.counts


class _LinkNemesis(Nemesis):
    needs = "nfqueue"

    def __init__(self) -> None:
        self.fault: QueuedLink | None = None
        self.loss_ns: str | None = None

    def victim(self, rig: Rig, rng: random.Random) -> str:
        assert rig.net is not None
        return rng.choice([*rig.names, *(m for m in rig.net.members if m.startswith("zk"))])

    def queue(self, rig: Rig, rng: random.Random, **params: float) -> str:
        assert rig.net is not None
        victim = self.victim(rig, rng)
        self.fault = QueuedLink(rig.net, victim, seed=rng.randrange(1 << 30), **params).start()
        return victim

    def heal(self, rig: Rig) -> None:
        try:
            if self.fault is not None:
                self.fault.stop()
            if self.loss_ns is not None:
                _run(["ip", "netns", "exec", self.loss_ns, "nft", "delete", "table", "inet", NFT_TABLE],
                     check=False)
        finally:
            self.fault, self.loss_ns = None, None
            rig.heal()


class LinkDelay(_LinkNemesis):
    """Every packet in and out of one member held 50-300 ms, with a jitter of half that (so some packets
    overtake others)."""

    name = "link_delay"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        delay = rng.choice((50, 150, 300))
        victim = self.queue(rig, rng, delay_ms=delay, jitter_ms=delay / 2)
        return f"{victim}'s link delayed {delay} ms ± {delay // 2} ms each way"


class LinkLoss(_LinkNemesis):
    """5-30 % of the packets in and out of one member dropped (NFQUEUE; nft numgen where NFQUEUE is
    missing)."""

    name = "link_loss"
    needs = "nft-loss"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        loss = rng.choice((0.05, 0.15, 0.3))
        if link_fault_support()[0] == "nfqueue":
            victim = self.queue(rig, rng, loss=loss)
            return f"{victim}'s link loses {loss:.0%} of the packets each way"
        victim = self.victim(rig, rng)
        assert rig.net is not None
        self.loss_ns = rig.net.ns(victim)
        _nft_loss(self.loss_ns, round(loss * 100))
        return f"{victim}'s link loses {loss:.0%} of the packets each way (nft)"


class LinkReorder(_LinkNemesis):
    """A quarter to a half of the packets in and out of one member held 20-80 ms longer than the rest: the
    packets behind them arrive first."""

    name = "link_reorder"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        share = rng.choice((0.25, 0.5))
        extra = rng.choice((20, 80))
        victim = self.queue(rig, rng, delay_ms=1.0, reorder=share, reorder_ms=extra)
        return f"{victim}'s link reorders: {share:.0%} of the packets held {extra} ms longer"


LINK_NEMESES: dict[str, type[Nemesis]] = {n.name: n for n in (LinkDelay, LinkLoss, LinkReorder)}


def available_link_nemeses() -> dict[str, type[Nemesis]]:
    """The link nemeses this machine supports (probed)."""
    mode, _ = link_fault_support()
    if mode == "nfqueue":
        return dict(LINK_NEMESES)
    if mode == "nft-loss":
        return {LinkLoss.name: LinkLoss}
    return {}


def describe_support() -> str:
    mode, reason = link_fault_support()
    if mode == "nfqueue":
        return "link delay/loss/reorder through NFQUEUE (a userspace packet queue; no netem in this kernel)"
    if mode == "nft-loss":
        return f"link loss only, through nft numgen ({reason})"
    return f"no link delay/loss/reorder ({reason})"

