"""A userspace packet queue for link faults: delay, loss and reorder without netem.

An ``iptables -j NFQUEUE`` rule hands each packet of a network namespace to this program (run inside that
namespace) through an ``nfnetlink_queue`` socket; it answers every packet with a verdict later, or never:

* delay: a packet's verdict (ACCEPT) is given ``delay_ms`` ± ``jitter_ms`` after it arrived, so the packet
  leaves (or is delivered) that much later;
* loss: a fraction ``loss`` of the packets get DROP;
* reorder: a fraction ``reorder`` of the packets is held ``reorder_ms`` longer than the others, so packets
  sent after them overtake them (a jitter larger than the gap between packets reorders as well).

    python -m tests.chaos.linkqueue --queue 7 --delay-ms 80 --jitter-ms 40 --loss 0.05 --reorder 0.2 \
        --seconds 600 --seed 3

The netlink protocol is spoken directly (``socket.AF_NETLINK``): no libnetfilter_queue, no pip package.  It
exits after ``--seconds`` at the latest (bounded), and on SIGTERM/SIGINT it lets every held packet through and
unbinds.  With ``--queue-bypass`` on the rule, packets pass unqueued once this program is gone.  It prints
``ready`` once bound, and counters (``accepted dropped reordered``) when it exits.
"""

from __future__ import annotations

import argparse
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NETLINK_NO_ENOBUFS = 5
SOL_NETLINK = 270
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NF_DROP = 0
NF_ACCEPT = 1
NLMSG_HDR = struct.Struct("=IHHII")
NFGEN_HDR = struct.Struct("!BBH")  # family, version, resource id (the queue number), big endian


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    pos = 0
    while pos + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, pos)
        if length < 4:
            break
        out[kind & 0x7FFF] = data[pos + 4 : pos + length]
        pos += (length + 3) & ~3
    return out


class Queue:
    """One bound ``nfnetlink_queue`` (in the caller's network namespace)."""

    def __init__(self, num: int, maxlen: int = 20000) -> None:
        self.num = num
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
        self._config(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)))

    def _send(self, msg_type: int, flags: int, body: bytes) -> int:
        self.seq += 1
        header = NLMSG_HDR.pack(NLMSG_HDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags,
                                self.seq, 0)
        self.sock.send(header + body)
        return self.seq

    def _config(self, attrs: bytes) -> None:
        seq = self._send(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK,
                         NFGEN_HDR.pack(socket.AF_UNSPEC, 0, self.num) + attrs)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            for msg_type, msg_seq, payload in self._read(timeout=1.0):
                if msg_type == NLMSG_ERROR and msg_seq == seq:
                    (errno,) = struct.unpack_from("=i", payload)
                    if errno != 0:
                        raise OSError(-errno, f"nfnetlink_queue config of queue {self.num} refused")
                    return
        raise TimeoutError("no answer from nfnetlink_queue")

    def _read(self, timeout: float) -> list[tuple[int, int, bytes]]:
        p = select.poll()  # not select.select: a test process may hold descriptors past 1024
        p.register(self.sock, select.POLLIN)
        if not p.poll(max(0.0, timeout) * 1000):
            return []
        data = self.sock.recv(1 << 17)
        out = []
        pos = 0
        while pos + NLMSG_HDR.size <= len(data):
            length, msg_type, _flags, seq, _pid = NLMSG_HDR.unpack_from(data, pos)
            if length < NLMSG_HDR.size:
                break
            out.append((msg_type, seq, data[pos + NLMSG_HDR.size : pos + length]))
            pos += (length + 3) & ~3
        return out

    def packets(self, timeout: float) -> list[int]:
        """Ids of the packets that arrived within ``timeout`` seconds."""
        ids = []
        for msg_type, _seq, payload in self._read(timeout):
            if msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                continue
            hdr = _attrs(payload[NFGEN_HDR.size :]).get(NFQA_PACKET_HDR)
            if hdr is not None and len(hdr) >= 4:
                ids.append(struct.unpack_from("!I", hdr)[0])
        return ids

    def verdict(self, packet_id: int, verdict: int) -> None:
        body = NFGEN_HDR.pack(socket.AF_UNSPEC, 0, self.num) + _attr(
            NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
        self._send(NFQNL_MSG_VERDICT, NLM_F_REQUEST, body)

    def close(self) -> None:
        try:
            self._send(NFQNL_MSG_CONFIG, NLM_F_REQUEST,
                       NFGEN_HDR.pack(socket.AF_UNSPEC, 0, self.num)
                       + _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, socket.AF_INET)))
        finally:
            self.sock.close()


def serve(q: Queue, rng: random.Random, delay_ms: float, jitter_ms: float, loss: float, reorder: float,
          reorder_ms: float, seconds: float, stop: list[bool]) -> tuple[int, int, int]:
    held: list[tuple[float, int, int]] = []  # (release at, arrival order, packet id)
    accepted = dropped = reordered = order = 0
    end = time.monotonic() + seconds
    while not stop[0] and time.monotonic() < end:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, pid = heapq.heappop(held)
            q.verdict(pid, NF_ACCEPT)
            accepted += 1
        wait = min(0.2, held[0][0] - now) if held else 0.2
        for pid in q.packets(wait):
            if rng.random() < loss:
                q.verdict(pid, NF_DROP)
                dropped += 1
                continue
            hold = max(0.0, delay_ms + rng.uniform(-jitter_ms, jitter_ms))
            if rng.random() < reorder:
                hold += reorder_ms
                reordered += 1
            order += 1
            heapq.heappush(held, (time.monotonic() + hold / 1000.0, order, pid))
    for _, _, pid in sorted(held, key=lambda h: h[1]):  # the heal: let everything held through
        q.verdict(pid, NF_ACCEPT)
        accepted += 1
    return accepted, dropped, reordered


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.linkqueue")
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--reorder", type=float, default=0.0)
    ap.add_argument("--reorder-ms", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stop = [False]

    def on_signal(signum: int, frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    q = Queue(args.queue)
    print("ready", flush=True)
    try:
        counts = serve(q, random.Random(args.seed), args.delay_ms, args.jitter_ms, args.loss, args.reorder,
                       args.reorder_ms, args.seconds, stop)
    finally:
        q.close()
    print("accepted {} dropped {} reordered {}".format(*counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
