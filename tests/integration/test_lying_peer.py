"""A peer that lies, on the fetch path (real ZooKeeper, in-process replicas, a mutating proxy in front of r1's
DataPartsExchange server): r2 fetches r1's part through the proxy, which answers with a seeded random
mutation of the genuine answer each time — flipped, truncated, extended or emptied bodies, other statuses,
other protocol cookies, hostile file names, lying sizes, a stall, and a valid body of *another* part (a
consistent lie only the comparison with r1's checksums in ZooKeeper can catch).

Every lie must end in a fetch error of our own kinds, with nothing committed (no active part, no
``replicas/r2/parts/<part>``), no temporary directory left and no file written outside the table's
directory; at the end the proxy tells the truth and the part arrives with r1's rows.
``FUZZ_EXAMPLES`` sets the number of lies (default 40).
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest

from replicad.errors import CorruptedDataError, InsecurePathError, NotEnoughSpaceError
from replicad.model.address import ReplicaAddress
from replicad.replication.fetcher import FetchError
from replicad.storage.part_transfer import RECEIVE_MAX_PROTOCOL_VERSION
from tests.support.table_cluster import Cluster, rows, sorted_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
ALLOWED = (CorruptedDataError, InsecurePathError, NotEnoughSpaceError, FetchError)
MUTATIONS = ("flip", "truncate", "append", "empty", "status", "cookie", "swap", "name", "size", "stall",
             "chunked_lie")


class LyingProxy:
    """Forwards each request to ``upstream`` and answers with ``mutate(head, body)``'s version."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode = "truth"
        self.rng = random.Random(0)
        self.other_body: bytes | None = None  # a genuine body of another part (for "swap")
        self.other_name = ""  # that part (asked for, it is the truth)
        self.asked = ""  # the part of the request being answered
        self.served = 0
        self.last = ""  # what the last answer's lie was
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            request = head + await reader.readexactly(length)
            target = head.split(b" ", 2)[1].decode("latin-1")
            self.asked = parse_qs(urlsplit(target).query).get("part", [""])[0]
            status, headers, body = await self._upstream(request)
            self.served += 1
            await self._answer(writer, status, headers, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _upstream(self, request: bytes) -> tuple[bytes, list[bytes], bytes]:
        r, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        w.write(request.replace(b"Connection: keep-alive", b"Connection: close")
                .replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        await w.drain()
        raw = await r.read()
        w.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = [h for h in lines[1:] if not h.lower().startswith((b"content-length", b"connection",
                                                                      b"transfer-encoding"))]
        if b"chunked" in head.lower():
            body = _dechunk(body)
        return lines[0], headers, body

    async def _answer(self, writer: asyncio.StreamWriter, status: bytes, headers: list[bytes],
                      body: bytes) -> None:
        rng, mode = self.rng, self.mode
        self.last = mode
        if mode == "flip" and body:
            b = bytearray(body)
            at, xor = rng.randrange(len(b)), rng.randrange(1, 256)
            self.last = f"flip at {at} of {len(b)}: {bytes(b[max(0, at - 20):at + 20])!r} ^ {xor}"
            b[at] ^= xor
            body = bytes(b)
        elif mode == "truncate":
            body = body[:rng.randrange(len(body))]
        elif mode == "append":
            body += os.urandom(rng.randrange(1, 64))
        elif mode == "empty":
            body = b""
        elif mode == "status":
            status = rng.choice([b"HTTP/1.1 500 Internal Server Error", b"HTTP/1.1 404 Not Found",
                                 b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 429 Too Many",
                                 b"HTTP/1.1 302 Found", b"HTTP/1.1 204 No Content"])
        elif mode == "cookie":
            # (3, the version r1 really answers with, would be the truth, and 4's body is 3's for a Wide part)
            version = rng.choice([b"0", b"1", b"2", b"5", b"6", b"7", b"9", b"11", b"999", b"x", b"-1"])
            headers = [h for h in headers if not h.lower().startswith(b"set-cookie")]
            headers.append(b"Set-Cookie: server_protocol_version=" + version + b"; Path=/")
            self.last = f"cookie {version!r}"
        elif mode == "swap" and self.other_body is not None and self.asked != self.other_name:
            body = self.other_body
        elif mode == "name":
            evil = rng.choice([b"../../x.txt", b"/etc/x.bin", b"a/../../x.b", b"..\x00......."])
            for name in (b"columns.txt", b"checksums.txt", b"count.txt"):
                if name in body:
                    body = body.replace(name, evil[:len(name)].ljust(len(name), b"."), 1)
                    break
        elif mode == "size":
            name = b"count.txt"
            at = body.find(name)
            if at >= 0:
                at += len(name)
                lie = rng.choice([0, 2, 1 << 20, 1 << 40, (1 << 64) - 1])
                body = body[:at] + struct.pack("<Q", lie) + body[at + 8:]
        elif mode == "stall":
            head = status + b"\r\n" + b"\r\n".join(headers)
            writer.write(head + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
            await writer.drain()
            await asyncio.sleep(3.0)  # longer than the fetcher's read timeout here
            return
        elif mode == "chunked_lie":
            writer.write(status + b"\r\n" + b"\r\n".join(headers) + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n" % (len(body) + 100) + body + b"\r\n0\r\n\r\n")
            await writer.drain()
            return
        writer.write(status + b"\r\n" + b"\r\n".join(headers)
                     + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[:size]
        data = data[size + 2:]


def _files_outside(root: Path, table_dir: Path) -> list[Path]:
    return [p for p in root.rglob("x.*") if table_dir not in p.parents]


async def test_every_lie_is_refused_and_the_truth_gets_through(cluster: Cluster, tmp_path: Path) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.blockers.fetches = True  # r2's queue leaves the part alone: the test fetches it itself
    proxy = LyingProxy(cluster.servers["r1"].port)
    await proxy.start()
    try:
        # r2 reaches r1 through the proxy (set before the inserts: r2 looks it up when it reads the log)
        host_path = r1.paths.me.host
        address = ReplicaAddress.parse((await r1.keeper.get(host_path))[0])
        moved = ReplicaAddress(address.host, proxy.port, address.queries_port, address.database,
                               address.table, address.scheme)
        await r1.keeper.set(host_path, moved.to_text().encode())
        r2.fetcher.timeout = aiohttp.ClientTimeout(total=20, sock_connect=5, sock_read=1.0)
        await r1.insert_table(rows(range(0, 50), month=10))
        await r1.insert_table(rows(range(100, 170), month=11))
        parts = sorted(r1.store.active_names())
        assert len(parts) == 2
        target, other = parts[1], parts[0]
        # a genuine answer for the other part (the "swap" lie)
        async with aiohttp.ClientSession() as s:
            params = {"endpoint": f"DataPartsExchange:{r1.paths.me.root}", "part": other, "compress": "false",
                      "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION)}  # as the fetcher asks
            async with s.post(f"http://127.0.0.1:{cluster.servers['r1'].port}/", params=params) as resp:
                assert resp.status == 200
                proxy.other_body = await resp.read()

        rng = random.Random(int(os.environ.get("FUZZ_SEED", "20261125")))
        outcomes: dict[str, int] = {}
        for i in range(EXAMPLES):
            proxy.mode = MUTATIONS[i % len(MUTATIONS)] if i < len(MUTATIONS) else rng.choice(MUTATIONS)
            proxy.rng = random.Random(rng.getrandbits(32))
            try:
                await r2.fetcher.fetch_part(target, "r1")
            except ALLOWED as e:
                outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            else:
                # a mutation can be harmless (a cookie the body happens to fit is not one): never here
                pytest.fail(f"lie {i} ({proxy.last}) was accepted")
            assert r2.store.get(target) is None, proxy.mode
            assert await r2.keeper.exists(r2.paths.me.part(target)) is None, proxy.mode
            leftovers = [p.name for p in r2.layout.path.iterdir() if p.name.startswith("tmp")]
            assert leftovers == [], (proxy.mode, leftovers)
            assert _files_outside(tmp_path, r2.layout.path) == [], proxy.mode
        assert proxy.served >= EXAMPLES
        assert outcomes.get("CorruptedDataError", 0) > 0 and outcomes.get("FetchError", 0) > 0, outcomes

        proxy.mode = "truth"
        await r2.fetcher.fetch_part(target, "r1")
        assert target in r2.store.active_names()
        mine = await sorted_rows(r2)
        theirs = [r for r in await sorted_rows(r1) if r["id"] >= 100]
        assert mine == theirs
    finally:
        await proxy.stop()


async def test_an_early_download_of_a_lie_is_refused_at_commit(cluster: Cluster) -> None:
    """Early downloads (started while the log entries are copied) skip the comparison with the source's
    checksums in ZooKeeper during the download, for speed: the commit makes it, against every replica that
    registered the part.  A consistent lie (a valid body of another part) taken early is refused there."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    proxy = LyingProxy(cluster.servers["r1"].port)
    await proxy.start()
    try:
        host_path = r1.paths.me.host
        address = ReplicaAddress.parse((await r1.keeper.get(host_path))[0])
        await r1.keeper.set(host_path, ReplicaAddress(address.host, proxy.port, address.queries_port,
                                                      address.database, address.table,
                                                      address.scheme).to_text().encode())
        await r1.insert_table(rows(range(0, 50), month=10))
        await r2.sync_replica(60)  # through the proxy, telling the truth: r2 now knows r1's address
        first = r1.store.active_names()[0]
        async with aiohttp.ClientSession() as s:
            params = {"endpoint": f"DataPartsExchange:{r1.paths.me.root}", "part": first, "compress": "false",
                      "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION)}
            async with s.post(f"http://127.0.0.1:{cluster.servers['r1'].port}/", params=params) as resp:
                proxy.other_body, proxy.other_name = await resp.read(), first
        proxy.mode = "swap"
        taken = r2.fetcher.early_fetches_taken
        await r1.insert_table(rows(range(100, 170), month=11))
        second = next(n for n in r1.store.active_names() if n != first)
        deadline = asyncio.get_running_loop().time() + 20
        while r2.fetcher.early_fetches_taken == taken and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert r2.fetcher.early_fetches_taken > taken, "the early download was not used"
        await asyncio.sleep(1.0)
        assert r2.store.get(second) is None
        assert await r2.keeper.exists(r2.paths.me.part(second)) is None
        assert [p.name for p in r2.layout.path.iterdir() if p.name.startswith("tmp")] == []
        proxy.mode = "truth"
        await r2.sync_replica(60)
        assert await sorted_rows(r2) == await sorted_rows(r1)
    finally:
        await proxy.stop()
