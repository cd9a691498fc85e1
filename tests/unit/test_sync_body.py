"""``SyncBody.line_blocks``: a body arriving in pieces of any size comes out as blocks that end at line ends
and join back to the body byte for byte; a line longer than ``max_line_bytes`` is refused."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.errors import BadInputError
from replicad.server.sync_body import SyncBody


class _Pieces:
    """An async body handing out the given pieces, at most ``n`` bytes of the current one per read."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = [p for p in pieces if p]

    async def read(self, n: int = -1) -> bytes:
        if not self.pieces:
            return b""
        head = self.pieces[0]
        if 0 <= n < len(head):
            self.pieces[0] = head[n:]
            return head[:n]
        self.pieces.pop(0)
        return head


def _blocks(pieces: list[bytes], size: int, chunk: int, max_line: int = 1 << 20,
            prefix: bytes = b"") -> list[bytes]:
    async def go() -> list[bytes]:
        loop = asyncio.get_running_loop()
        body = SyncBody(_Pieces(pieces), loop, 1 << 30, prefix, chunk, max_line_bytes=max_line)
        return await loop.run_in_executor(None, lambda: list(body.line_blocks(size)))

    return asyncio.run(go())


_text = st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\t", b"xyz" * 5, b"\r\n"]), max_size=60).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_text, st.lists(st.integers(0, 40), max_size=8), st.integers(1, 30), st.integers(1, 12),
       st.integers(0, 5))
@example(b"ab\ncd\nef", [2, 2], 3, 1, 0)
@example(b"abcdef\n", [], 2, 1, 0)
def test_blocks_join_to_the_body_and_end_at_line_ends(body: bytes, cuts: list[int], size: int, chunk: int,
                                                      prefix_len: int) -> None:
    prefix, rest = body[:prefix_len], body[prefix_len:]
    pieces, at = [], 0
    for c in sorted(cuts):
        pieces.append(rest[at:c])
        at = max(at, c)
    pieces.append(rest[at:])
    blocks = _blocks(pieces, size, chunk, prefix=prefix)
    assert b"".join(blocks) == body
    assert all(blocks)
    for b in blocks[:-1]:
        assert b.endswith(b"\n")
    if blocks and not body.endswith(b"\n"):
        assert b"\n" not in blocks[-1]  # the unterminated tail comes alone


def test_a_line_longer_than_the_limit_is_refused() -> None:
    with pytest.raises(BadInputError, match="longer than 10 bytes"):
        _blocks([b"short\n", b"x" * 30, b"\n"], 4, 3, max_line=10)
    assert _blocks([b"short\n", b"x" * 9, b"\n"], 4, 3, max_line=10) == [b"short\n", b"x" * 9 + b"\n"]


class _Trickle(_Pieces):
    """Pieces arriving one by one (each read yields to the loop first), with a pause before ``pause_at``."""

    def __init__(self, pieces: list[bytes], pause_at: int = -1, pause_s: float = 0.0) -> None:
        super().__init__(pieces)
        self.reads, self.pause_at, self.pause_s = 0, pause_at, pause_s

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        await asyncio.sleep(self.pause_s if self.reads == self.pause_at else 0)
        return await super().read(n)


def test_a_block_is_gathered_on_the_loop_in_one_hand_over() -> None:
    """200 pieces of 1 KiB for one 1 MiB block: one wait for the loop (not one per piece, each a thread
    switch that waits for the scheduler under load); a stall of the sender hands over what has arrived."""
    pieces = [b"%04d" % i + b"x" * 1019 + b"\n" for i in range(200)]
    handovers = []

    async def go(source: _Trickle) -> list[bytes]:
        loop = asyncio.get_running_loop()
        body = SyncBody(source, loop, 1 << 30)
        gather = body._gather

        async def counted(n: int) -> list[bytes]:
            handovers.append(n)
            return await gather(n)

        body._gather = counted  # type: ignore[method-assign]
        return await loop.run_in_executor(None, lambda: list(body.line_blocks(1 << 20)))

    assert b"".join(asyncio.run(go(_Trickle(pieces)))) == b"".join(pieces)
    assert len(handovers) == 2  # the block, then the end of the body
    handovers.clear()
    blocks = asyncio.run(go(_Trickle(pieces, pause_at=100, pause_s=0.3)))
    assert b"".join(blocks) == b"".join(pieces)
    assert len(handovers) == 3  # what came before the pause, the rest of the block, the end


class _Gated(_Pieces):
    """Pieces handed out for ``allowed`` reads, then only once ``gate`` is set; counts the reads that
    started and those cancelled while waiting."""

    def __init__(self, pieces: list[bytes], allowed: int) -> None:
        super().__init__(pieces)
        self.gate = asyncio.Event()
        self.allowed = allowed
        self.started = self.cancelled = 0

    async def read(self, n: int = -1) -> bytes:
        self.started += 1
        if self.started > self.allowed:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().read(n)


def test_the_next_block_is_read_while_one_is_parsed_and_the_read_ahead_stops() -> None:
    """Once a block is handed out, the loop already reads the next one (receiving overlaps parsing); when
    the parse stops early (an error, a closed connection), cancel_read_ahead cancels that read and nothing
    more is read; without a stop, the read-ahead block is the next one handed out."""
    async def go(stop: bool) -> list[bytes]:
        loop = asyncio.get_running_loop()
        source = _Gated([b"a\n" * 10, b"b\n" * 10, b"c\n" * 10], allowed=1)
        body = SyncBody(source, loop, 1 << 30, chunk=20)
        blocks = body.line_blocks(20)
        got = [await loop.run_in_executor(None, next, blocks)]
        await asyncio.sleep(0.05)
        assert source.started == 2  # the second block's read began before the parser asked for it
        if stop:
            body.cancel_read_ahead()
            await asyncio.sleep(0.05)
            assert source.cancelled == 1 and source.started == 2
            blocks.close()
            return got
        source.gate.set()
        got += await loop.run_in_executor(None, list, blocks)
        assert source.cancelled == 0
        return got

    assert asyncio.run(go(stop=True)) == [b"a\n" * 10]
    assert asyncio.run(go(stop=False)) == [b"a\n" * 10, b"b\n" * 10, b"c\n" * 10]


def test_the_rest_of_a_header_read_is_topped_up_to_a_whole_block() -> None:
    """*WithNames: the header line is read 64 KiB at a time and the rest put back; the first block is still
    a whole block (not that rest alone, a small block and one more hand-over to the loop)."""
    lines = [b"%05d" % i + b"x" * 1018 + b"\n" for i in range(400)]
    data = b"a\tb\n" + b"".join(lines)

    async def go() -> tuple[bytes, list[bytes]]:
        loop = asyncio.get_running_loop()
        body = SyncBody(_Pieces([data[i:i + 4096] for i in range(0, len(data), 4096)]), loop, 1 << 30)

        def work() -> tuple[bytes, list[bytes]]:
            return body.readline_raw(), list(body.line_blocks(200_000))

        return await loop.run_in_executor(None, work)

    header, blocks = asyncio.run(go())
    assert header == b"a\tb\n" and b"".join(blocks) == b"".join(lines)
    assert len(blocks[0]) > 190_000  # a whole block, not the ~64 KiB left from the header's read


@settings(max_examples=300, deadline=None)
@given(_text, st.integers(0, 80), st.lists(st.integers(-1, 25), min_size=1, max_size=12),
       st.lists(st.booleans(), max_size=12))
@example(b"ab\ncd\n", 6, [2, -1], [True])
def test_reads_of_any_size_and_lines_given_back_return_the_body_once(
        body: bytes, prefix_len: int, sizes: list[int], lines: list[bool]) -> None:
    """Reads of any size (all: -1), lines (a read whose rest is given back) and the prefix's bytes served
    without a copy: the body comes out once, in order."""
    prefix, rest = body[:prefix_len], body[prefix_len:]

    async def go() -> bytes:
        loop = asyncio.get_running_loop()
        sb = SyncBody(_Pieces([rest[:7], rest[7:]]), loop, 1 << 30, prefix, 5)

        def read_all() -> bytes:
            out = bytearray()
            for i, n in enumerate(sizes * 20):
                data = sb.readline_raw() if i < len(lines) and lines[i] else sb.read(n)
                if not data and n != 0:
                    break
                out += data
            while data := sb.read(3):
                out += data
            return bytes(out)

        return await loop.run_in_executor(None, read_all)

    assert asyncio.run(go()) == body


def test_a_whole_body_given_at_once_is_read_without_a_copy() -> None:
    body = b"1\ta\n" * 1000
    sb = SyncBody(_Pieces([]), asyncio.new_event_loop(), 1 << 30, body, complete=True)
    assert sb.read() is body  # the object itself: no copy of a 0.7 MB body on the loop
    assert sb.read() == b""
