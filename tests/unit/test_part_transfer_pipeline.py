"""The threaded DataPartsExchange paths: the receiver's writer thread (batches, bounded hand-over, errors,
cancellation), the sender's read-ahead thread, and keep-alive connections of the interserver server."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from replicad.errors import CorruptedDataError
from replicad.server.interserver import Endpoint, InterserverServer, PartToSend
from replicad.storage import part_sink
from replicad.storage.checksums import Checksums
from replicad.storage.part_receive import receive_part
from replicad.storage.part_transfer import iter_part_body, iter_part_body_sync
from tests.support.synthetic_part import write_part

REPLICA = "/clickhouse/tables/t/replicas/r1"


class Trickle:
    """A stream handing out the body in random-sized pieces, yielding to the loop between them."""

    def __init__(self, data: bytes, seed: int = 1, max_piece: int = 3000) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.rng = random.Random(seed)
        self.max_piece = max_piece

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        n = self.rng.randint(1, self.max_piece)
        piece = bytes(self.data[self.pos : self.pos + n])
        self.pos += len(piece)
        return piece

    async def read(self, n: int = -1) -> bytes:
        return await self.readany()

    async def readexactly(self, n: int) -> bytes:  # pragma: no cover - not used by the receiver
        raise NotImplementedError


def make_part(root: Path, sizes: dict[str, int]) -> tuple[Path, Checksums]:
    part = root / "all_1_1_0"
    rng = random.Random(3)
    return part, write_part(part, {name: rng.randbytes(size) for name, size in sizes.items()})


SIZES = {"a.bin": 50_000, "a.mrk": 16, "b.bin": 123_457, "c.bin": 0, "count.txt": 1}


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Batches of 4 KB, at most 2 pending; the writer thread is slowed down and records what was pending."""
    monkeypatch.setattr(part_sink, "BATCH_SIZE", 4096)
    monkeypatch.setattr(part_sink, "BATCHES_PENDING", 2)
    pending: list[int] = []
    real = part_sink.PartSink._write

    def slow(self: part_sink.PartSink, *args: object) -> object:
        pending.append(self._pending)
        time.sleep(0.0005)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(part_sink.PartSink, "_write", slow)
    return pending


async def test_many_batches_bounded_memory(tmp_path: Path, small_batches: list[int]) -> None:
    part, cs = make_part(tmp_path, SIZES)
    body = b"".join(iter_part_body_sync(part, cs, 3, 10_000))
    got = await receive_part(Trickle(body), tmp_path / "recv", 3, cs)
    assert got.checksums == cs and got.body_size == len(body)
    assert got.columns_text == (part / "columns.txt").read_text()
    for p in part.iterdir():
        assert (got.path / p.name).read_bytes() == p.read_bytes()
    assert len(small_batches) > 40
    # at most 2 batches of 4 KB (+ the last piece that filled a batch) were ever waiting for the thread
    assert max(small_batches) <= 2 * 4096 + 3000


async def test_bad_hash_inside_a_big_file(tmp_path: Path, small_batches: list[int]) -> None:
    part, cs = make_part(tmp_path, SIZES)
    body = bytearray(b"".join(iter_part_body_sync(part, cs, 0)))
    pos = body.index((part / "b.bin").read_bytes()[:64]) + 100_000
    body[pos] ^= 1
    target = tmp_path / "recv"
    with pytest.raises(CorruptedDataError, match=r"Checksum mismatch for file b\.bin transferred"):
        await receive_part(Trickle(bytes(body)), target, 0, cs)
    assert not target.exists()


async def test_cancelled_receive_leaves_nothing(tmp_path: Path, small_batches: list[int]) -> None:
    part, cs = make_part(tmp_path, SIZES)
    body = b"".join(iter_part_body_sync(part, cs, 0))
    stream = Trickle(body[: len(body) // 2] + b"")  # never ends by itself: cancelled while it waits
    hang = asyncio.Event()

    async def readany() -> bytes:
        piece = await Trickle.readany(stream)
        if not piece:
            await hang.wait()
        return piece

    stream.readany = readany  # type: ignore[method-assign]
    target = tmp_path / "recv"
    task = asyncio.create_task(receive_part(stream, target, 0, cs))
    while stream.pos < len(body) // 2:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not target.exists()
    assert not [t for t in threading.enumerate() if t.name == "part-receiver"]


async def test_sender_stops_when_the_consumer_does(tmp_path: Path) -> None:
    part, cs = make_part(tmp_path, {"big.bin": 3_000_000})
    body = iter_part_body(part, cs, 0, chunk_size=100_000, read_ahead=2)
    first = await anext(body)
    assert len(first) >= 50_000
    await body.aclose()  # type: ignore[attr-defined]
    for _ in range(200):
        if not [t for t in threading.enumerate() if t.name == "part-sender"]:
            break
        await asyncio.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name == "part-sender"]
    pieces = [p async for p in iter_part_body(part, cs, 0, chunk_size=100_000)]
    assert b"".join(pieces) == b"".join(iter_part_body_sync(part, cs, 0))


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes, dict[str, str]]:
    """One chunked or Content-Length response from ``sock`` (``buf`` keeps what follows it)."""
    def fill() -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError
        buf.extend(chunk)

    while b"\r\n\r\n" not in buf:
        fill()
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    body = b""
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            fill()
        body, buf[:] = bytes(buf[:n]), buf[n:]
    else:
        while True:
            while b"\r\n" not in buf:
                fill()
            size_line, _, rest = bytes(buf).partition(b"\r\n")
            size = int(size_line, 16)
            while len(rest) < size + 2:
                fill()
                size_line, _, rest = bytes(buf).partition(b"\r\n")
            body += rest[:size]
            buf[:] = rest[size + 2 :]
            if size == 0:
                break
    return int(lines[0].split(" ")[1]), body, headers


async def test_keep_alive(tmp_path: Path) -> None:
    part, cs = make_part(tmp_path, SIZES)
    server = InterserverServer("127.0.0.1", 0)
    connections = 0
    serve = server._on_connection

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await serve(reader, writer)

    server._on_connection = counting  # type: ignore[method-assign]
    await server.start()
    server.register(REPLICA, Endpoint(lambda name: PartToSend(part, cs) if name == "all_1_1_0" else None))
    target = f"/?endpoint=DataPartsExchange:{REPLICA}&part=all_1_1_0&compress=false"
    expected = b"".join(iter_part_body_sync(part, cs, 0))

    def talk() -> list[tuple[int, bytes, dict[str, str]]]:
        out = []
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
            buf = bytearray()
            for extra in ("", "", "Connection: close\r\n"):
                c.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
                out.append(read_response(c, buf))
            c.sendall(b"GET /ping HTTP/1.1\r\n\r\n")  # the server closed after "Connection: close"
            with pytest.raises((EOFError, ConnectionError)):
                read_response(c, buf)
        return out

    try:
        answers = await asyncio.to_thread(talk)
        assert [(s, b) for s, b, _ in answers] == [(200, expected)] * 3
        assert [h["connection"].lower() for _, _, h in answers] == ["keep-alive", "keep-alive", "close"]
        # aiohttp reuses the connection; an idle kept-alive connection does not hold up stop()
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(f"http://127.0.0.1:{server.port}{target}") as resp:
                    assert await resp.read() == expected
        assert server.requests == 6
        assert connections == 2
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{server.port}/ping") as resp:
                assert await resp.text() == "Ok.\n"
            t0 = time.monotonic()
            await server.stop(grace_s=5.0)
            assert time.monotonic() - t0 < 1.0
    finally:
        await server.stop(grace_s=0.1)


async def test_sink_made_before_the_body(tmp_path: Path) -> None:
    part, cs = make_part(tmp_path, SIZES)
    body = b"".join(iter_part_body_sync(part, cs, 0))
    sink = part_sink.PartSink(tmp_path / "early", False)
    got = await receive_part(Trickle(body), tmp_path / "early", 0, cs, sink=sink)
    assert got.checksums == cs
    # a request that failed before any body: the fetcher discards the sink, and its directory goes
    unused = part_sink.PartSink(tmp_path / "unused", False)
    await unused.discard()
    await unused.discard()
    assert not (tmp_path / "unused").exists()
    # a directory that was there already is not the sink's to remove
    (tmp_path / "taken").mkdir()
    taken = part_sink.PartSink(tmp_path / "taken", False)
    with pytest.raises(FileExistsError):
        await receive_part(Trickle(body), tmp_path / "taken", 0, cs, sink=taken)
    assert (tmp_path / "taken").is_dir()


async def test_sink_replaces_a_stale_directory_in_its_thread(tmp_path: Path) -> None:
    """A fetch's leftover ``tmp-fetch_`` directory (stale files, a subdirectory) is removed by the writer
    thread before it makes its own (the fetcher no longer checks on the loop): the received part holds
    exactly the sent files and bytes; without ``replace_stale`` the directory stays untouched (see above)."""
    part, cs = make_part(tmp_path, SIZES)
    body = b"".join(iter_part_body_sync(part, cs, 0))
    target = tmp_path / "tmp-fetch_stale"
    (target / "sub").mkdir(parents=True)
    (target / "stale.bin").write_bytes(b"old")
    (target / "sub" / "x").write_bytes(b"old")
    sink = part_sink.PartSink(target, False, replace_stale=True)
    got = await receive_part(Trickle(body), target, 0, cs, sink=sink)
    assert got.checksums == cs and sink.replaced_stale and sink.created
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in part.iterdir())
    for f in part.iterdir():
        assert (target / f.name).read_bytes() == f.read_bytes()
    fresh = part_sink.PartSink(tmp_path / "tmp-fetch_fresh", False, replace_stale=True)
    await receive_part(Trickle(body), tmp_path / "tmp-fetch_fresh", 0, cs, sink=fresh)
    assert not fresh.replaced_stale
