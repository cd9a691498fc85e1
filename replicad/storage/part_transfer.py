"""DataPartsExchange response body: sending a part and receiving one (the HTTP layer lives elsewhere).

Body layout (integers little endian, ``String`` = VarUInt length + bytes), by negotiated protocol version:

    v>=1  UInt64 sum of the file sizes listed in checksums.txt
    v>=2  String ttl infos ("ttl format version: 1\\n" + JSON; "{}" without TTL)
    v>=3  String part type ("Wide")
    v>=5  36 ASCII chars part UUID
    v>=7  UInt64 number of projections (each: String name + its own file list, before the main list)
    file list: UInt64 n, then per file: String name, UInt64 size, the bytes, 16-byte file hash
              (ClickHouse hashing-buffer hash of the bytes).

18.16 speaks only v0 (no cookie, ignores client_protocol_version).  We send v0..v3; we receive v0..v10
(zero-copy is never requested, projections are refused).  The sender checks every file against
checksums.txt as it reads it; the receiver validates names, streams files to disk with bounded memory,
checks every hash, requires EOF, then checks the received checksums.txt against the files.
File I/O and hashing run off the event loop.  A small part (:func:`is_small_part`: its files add up to at
most ``SMALL_PART_BYTES``) is built whole in one blocking call (:func:`build_part_body`, which the server
runs in the loop's default executor); a larger one is streamed by a thread of its own that reads 4 MiB
pieces ahead of the socket (:func:`iter_part_body`).  The receiver's thread is
:class:`replicad.storage.part_sink.PartSink`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from replicad import fault_plant
from replicad.errors import (
    CorruptedDataError,
    InsecurePathError,
    UnsupportedPartFormatError,
)
from replicad.model.cityhash import FileHasher
from replicad.model.varint import encode_varuint
from replicad.storage import part_sink
from replicad.storage.checksums import Checksums, MinimalisticChecksums
from replicad.storage.part import COMPACT_DATA_FILE, COMPACT_MARKS_FILES
from replicad.storage.part_sink import PartSink, ReceivedFile, Write
from replicad.storage.space_guard import SpaceGuard

CHECKSUMS_FILE = "checksums.txt"
COLUMNS_FILE = "columns.txt"
COUNT_FILE = "count.txt"
MAX_COUNT_FILE = 32  # count.txt is a decimal row count: kept from the body when it is at most this long
#: files a part may carry (and a sender may send) without an entry in checksums.txt
NO_CHECKSUM_FILES = frozenset(
    {
        CHECKSUMS_FILE,
        COLUMNS_FILE,
        "default_compression_codec.txt",
        "metadata_version.txt",
        "columns_substreams.txt",
        "txn_version.txt",
    }
)
SEND_MAX_PROTOCOL_VERSION = 3  # answer cookie server_protocol_version = min(client, this)
RECEIVE_MAX_PROTOCOL_VERSION = 10
TTL_INFOS_HEADER = "ttl format version: 1\n"
EMPTY_TTL_INFOS = TTL_INFOS_HEADER + "{}"
NIL_UUID = "00000000-0000-0000-0000-000000000000"
CHUNK_SIZE = 1 << 20
SEND_CHUNK_SIZE = 4 << 20
SMALL_PART_BYTES = 1 << 20  # a part whose files add up to at most this is sent in one piece
MAX_KEPT_FILE = 64 << 20  # checksums.txt and columns.txt are also kept in memory up to this size
MAX_FILES = 100_000
MAX_FILE_SIZE = 1 << 40
MAX_NAME_LENGTH = 255
MAX_PART_BYTES = 1 << 40  # a received part's files add up to at most this (interserver.max_fetch_part_bytes)
_WHOLE_BODY = 1 << 62  # a chunk size no body reaches
_U64 = struct.Struct("<Q")
_NAME_RE = re.compile(r"[A-Za-z0-9_.%+-]+")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class AsyncByteStream(Protocol):
    """What we need from aiohttp's StreamReader (asyncio.StreamReader fits too)."""

    async def readexactly(self, n: int) -> bytes: ...

    async def read(self, n: int = -1) -> bytes: ...


def check_file_name(name: str) -> str:
    """A file name inside a part directory: one plain path component of safe characters."""
    if not name or len(name) > MAX_NAME_LENGTH or name in (".", "..") or not _NAME_RE.fullmatch(name):
        raise InsecurePathError(f"Bad file name in part: {name!r}")
    return name


def _string(b: bytes) -> bytes:
    return encode_varuint(len(b)) + b


# ---------------------------------------------------------------------------------------------- sending


def body_header(checksums: Checksums, protocol_version: int, part_type: str = "Wide") -> bytes:
    """The fields before the file list for ``protocol_version`` (0 → empty)."""
    if not 0 <= protocol_version <= 7:
        raise ValueError(f"cannot send DataPartsExchange protocol version {protocol_version}")
    out = b""
    if protocol_version >= 1:
        out += _U64.pack(checksums.total_size)
    if protocol_version >= 2:
        out += _string(EMPTY_TTL_INFOS.encode())
    if protocol_version >= 3:
        out += _string(part_type.encode())
    if protocol_version >= 5:
        out += NIL_UUID.encode()
    if protocol_version >= 7:
        out += _U64.pack(0)  # no projections
    return out


def part_type_of(checksums: Checksums) -> str:
    """``Compact`` for a part whose columns share ``data.bin`` (as current ClickHouse writes small parts),
    else ``Wide``: what the body's part type field says (v>=3)."""
    if COMPACT_DATA_FILE in checksums.files and any(m in checksums.files for m in COMPACT_MARKS_FILES):
        return "Compact"
    return "Wide"


def files_to_send(checksums: Checksums, part_dir: str | None = None) -> list[str]:
    """checksums.txt entries plus checksums.txt and columns.txt, in byte order of the names (as 18.16); with
    ``part_dir``, also the small unchecksummed files current ClickHouse keeps beside them (metadata
    version, default codec, column substreams) where the part has them (an 18.16 part has none)."""
    extra = [n for n in sorted(NO_CHECKSUM_FILES - {CHECKSUMS_FILE, COLUMNS_FILE})
             if part_dir is not None and os.path.exists(os.path.join(part_dir, n))]
    return sorted({*checksums.files, CHECKSUMS_FILE, COLUMNS_FILE, *extra})


def iter_part_body_sync(
    part_dir: str | os.PathLike[str],
    checksums: Checksums,
    protocol_version: int = 0,
    chunk_size: int = CHUNK_SIZE,
) -> Generator[bytes, None, None]:
    """Generate the response body in pieces of about ``chunk_size`` bytes (blocking file reads).

    Every file is hashed while being read and compared with its checksums.txt entry; a mismatch (or a
    file changing size underneath) raises CorruptedDataError naming the file before its trailing hash
    is produced, so the receiver sees a truncated body rather than a wrong part."""
    base = Path(part_dir)
    dir_text = os.fspath(part_dir)  # plain string joins: a Path per file costs more than reading a small one
    names = files_to_send(checksums, dir_text)
    part_type = part_type_of(checksums)
    if part_type != "Wide" and protocol_version < 3:
        raise UnsupportedPartFormatError(f"Part {base.name} is {part_type}: a DataPartsExchange client of "
                                         f"protocol {protocol_version} reads Wide parts only")
    buf = bytearray(body_header(checksums, protocol_version, part_type))
    buf += _U64.pack(len(names))
    for name in names:
        expected = checksums.files.get(name)
        with open(os.path.join(dir_text, check_file_name(name)), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if expected is not None and size != expected.file_size:
                raise CorruptedDataError(
                    f"Unexpected size of file {name} in part {base.name}: "
                    f"{size} instead of {expected.file_size}"
                )
            buf += _string(name.encode())
            buf += _U64.pack(size)
            hasher = FileHasher()
            remaining = size
            while remaining:
                piece = f.read(min(chunk_size, remaining))
                if not piece:
                    raise CorruptedDataError(f"File {name} of part {base.name} shrank while being sent")
                hasher.update(piece)
                remaining -= len(piece)
                if not buf and len(piece) >= chunk_size // 2:
                    yield piece
                    continue
                buf += piece
                if len(buf) >= chunk_size:
                    yield bytes(buf)
                    buf = bytearray()
            if f.read(1):
                raise CorruptedDataError(f"File {name} of part {base.name} grew while being sent")
        digest = hasher.digest()
        planted = fault_plant.planted("skip_fetch_checksum")  # test-only planted bug
        if expected is not None and digest != expected.file_hash and not planted:
            raise CorruptedDataError(f"Checksum mismatch for file {name} in part {base.name}")
        buf += digest
        if len(buf) >= chunk_size:
            yield bytes(buf)
            buf = bytearray()
    if buf:
        yield bytes(buf)


def is_small_part(checksums: Checksums) -> bool:
    """Whether the part is sent whole (:func:`build_part_body`) rather than streamed: its files listed in
    checksums.txt add up to at most ``SMALL_PART_BYTES`` (checksums.txt and columns.txt themselves are
    small and not counted)."""
    return checksums.total_size <= SMALL_PART_BYTES


def build_part_body(
    part_dir: str | os.PathLike[str], checksums: Checksums, protocol_version: int = 0
) -> bytes:
    """The whole response body in one blocking call, for a small part (memory: the body).

    The same bytes as :func:`iter_part_body_sync` joined, with the same checks: CorruptedDataError when
    a file does not match checksums.txt, OSError when one cannot be read."""
    # one piece: every file is read in a single call and the body is copied out of its buffer once
    return b"".join(iter_part_body_sync(part_dir, checksums, protocol_version, _WHOLE_BODY))


async def iter_part_body(
    part_dir: str | os.PathLike[str],
    checksums: Checksums,
    protocol_version: int = 0,
    chunk_size: int = SEND_CHUNK_SIZE,
    read_ahead: int = 2,
) -> AsyncIterator[bytes]:
    """Async version of :func:`iter_part_body_sync`: one thread reads and hashes the files, up to
    ``read_ahead`` pieces ahead of the consumer (memory: a few ``chunk_size`` pieces, whatever the part)."""
    loop = asyncio.get_running_loop()
    # (piece or None, error or None, last)
    ready: asyncio.Queue[tuple[bytes | None, Exception | None, bool]] = asyncio.Queue()
    slots = threading.Semaphore(read_ahead)
    stop = threading.Event()

    def deliver(item: tuple[bytes | None, Exception | None, bool]) -> bool:
        if item[0] is not None:
            slots.acquire()
        if stop.is_set():
            return False
        try:
            loop.call_soon_threadsafe(ready.put_nowait, item)
        except RuntimeError:  # pragma: no cover - the loop is gone
            stop.set()
            return False
        return True

    def produce() -> None:
        gen = iter_part_body_sync(part_dir, checksums, protocol_version, chunk_size)
        held: bytes | None = None  # a short piece is probably the last: it goes with the end mark
        try:
            for piece in gen:
                if held is not None and not deliver((held, None, False)):
                    return
                held = None
                if len(piece) < chunk_size:
                    held = piece
                elif not deliver((piece, None, False)):
                    return
            deliver((held, None, True))
        except Exception as e:
            deliver((None, e, True))
        finally:
            gen.close()

    threading.Thread(target=produce, name="part-sender", daemon=True).start()
    try:
        while True:
            piece, error, last = await ready.get()
            if error is not None:
                raise error
            if piece is not None:
                slots.release()
                yield piece
            if last:
                return
    finally:
        stop.set()
        slots.release()  # a producer waiting for a slot sees ``stop``


# --------------------------------------------------------------------------------------------- receiving


@dataclass(frozen=True)
class ReceivedPart:
    """A fetched part sitting, verified, in ``path`` (a temporary directory the caller then renames)."""

    path: Path
    checksums: Checksums
    files: dict[str, ReceivedFile]
    part_type: str = "Wide"
    sum_files_size: int | None = None
    ttl_infos: str | None = None
    uuid: str | None = None
    body_size: int = 0
    extra_files: tuple[str, ...] = field(default=())
    columns_text: str = ""  # columns.txt (kept from the body)
    rows: int | None = None  # count.txt (kept from the body), None without a readable one

    @property
    def written(self) -> tuple[Checksums, str, int, int] | None:
        """(checksums, columns.txt, rows, bytes on disk) as ``PartStore.precommit`` takes them instead of
        reading the files back; None when count.txt was not kept (a part without one)."""
        if self.rows is None:
            return None
        return self.checksums, self.columns_text, self.rows, sum(f.size for f in self.files.values())


class _Body:
    """Reads the body through a buffer of its own, so that file data goes on as slices of the stream's own
    chunks (no copy); counts bytes and turns a short read into CorruptedDataError."""

    def __init__(self, stream: AsyncByteStream) -> None:
        self.stream = stream
        self.count = 0  # bytes consumed
        self._view = memoryview(b"")
        self._readany: Callable[[], Awaitable[bytes]] | None = getattr(stream, "readany", None)

    async def _more(self) -> bool:
        """Refill the (empty) buffer with what the stream has; False at the end of the stream."""
        readany = self._readany
        data = await (readany() if readany is not None else self.stream.read(part_sink.BATCH_SIZE))
        self._view = memoryview(data)
        return bool(data)

    async def exactly(self, n: int, what: str) -> bytes:
        view = self._view
        if len(view) >= n:
            self._view = view[n:]
            self.count += n
            return bytes(view[:n])
        parts = [view]
        have = len(view)
        while have < n:
            if not await self._more():
                raise CorruptedDataError(f"Truncated part body: {what} cut off at byte {self.count + have}")
            take = self._view[: n - have]
            self._view = self._view[len(take) :]
            parts.append(take)
            have += len(take)
        self.count += n
        return b"".join(parts)

    async def some(self, n: int, what: str) -> memoryview:
        """Between 1 and ``n`` bytes: what is buffered (waits only when nothing is)."""
        if not self._view and not await self._more():
            raise CorruptedDataError(f"Truncated part body: {what} cut off at byte {self.count}")
        piece = self._view[:n]
        self._view = self._view[len(piece) :]
        self.count += len(piece)
        return piece

    async def at_eof(self) -> bool:
        return not self._view and not await self._more()

    async def u64(self, what: str) -> int:
        return int(_U64.unpack(await self.exactly(8, what))[0])

    async def varuint(self, what: str) -> int:
        result = shift = 0
        for _ in range(10):
            b = (await self.exactly(1, what))[0]
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
        raise CorruptedDataError(f"Bad VarUInt in part body ({what}) at byte {self.count}")

    async def string(self, what: str, limit: int) -> bytes:
        n = await self.varuint(what)
        if n > limit:
            raise CorruptedDataError(f"Too long {what} in part body: {n} bytes")
        return await self.exactly(n, what)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def _receive_file(body: _Body, sink: PartSink, name: str, size: int) -> bytes | None:
    """Hand one file's bytes to ``sink`` in batches; returns them for checksums.txt and columns.txt."""
    what = f"file {name}"
    keep = (name in (CHECKSUMS_FILE, COLUMNS_FILE) and size <= MAX_KEPT_FILE) or (
        name == COUNT_FILE and size <= MAX_COUNT_FILE)
    kept: list[memoryview] = []
    remaining = size
    first = True
    pieces: list[memoryview] = []
    got = 0
    while remaining:
        piece = await body.some(min(remaining, part_sink.BATCH_SIZE - got), what)
        pieces.append(piece)
        got += len(piece)
        remaining -= len(piece)
        if keep:
            kept.append(piece)
        if got >= part_sink.BATCH_SIZE and remaining:
            await sink.add(Write(name, pieces, got, first, False))
            first, pieces, got = False, [], 0
    await sink.add(Write(name, pieces, got, first, True, await body.exactly(16, f"hash of {name}")))
    return b"".join(kept) if keep else None


async def receive_part(
    stream: AsyncByteStream,
    tmp_dir: str | os.PathLike[str],
    server_protocol_version: int = 0,
    expected_checksums: Checksums | MinimalisticChecksums | None = None,
    *,
    fsync: bool = False,
    max_files: int = MAX_FILES,
    max_file_size: int = MAX_FILE_SIZE,
    max_part_bytes: int = MAX_PART_BYTES,
    sink: PartSink | None = None,
) -> ReceivedPart:
    """Read a DataPartsExchange body from ``stream`` into the new directory ``tmp_dir`` and verify it.

    ``server_protocol_version`` is the sender's ``server_protocol_version`` cookie (0 when absent, as
    with 18.16).  Raises InsecurePathError for a bad file name and CorruptedDataError for anything else
    wrong (truncation, wrong hash, sizes or files not matching checksums.txt, trailing data, mismatch with
    ``expected_checksums``); ``tmp_dir`` is then removed.  ``tmp_dir`` must not exist yet.  ``sink``: a
    :class:`PartSink` for ``tmp_dir`` made beforehand (``fsync`` is then the sink's).

    Size: the files may add up to ``max_part_bytes`` and, when the sender declared the part's size (v>=1),
    to no more than that (checked as each file's size arrives, before its bytes are read).  Free space on
    ``tmp_dir``'s disk: for the declared part size before anything is written (v>=1); without one (v0,
    18.16), for the first file, every file of ``SPACE_CHECK_STEP`` bytes or more, and after each further
    ``SPACE_CHECK_STEP`` declared bytes.  NotEnoughSpaceError (code 243, retriable) when it would not fit."""
    if not 0 <= server_protocol_version <= RECEIVE_MAX_PROTOCOL_VERSION:
        raise CorruptedDataError(f"Unsupported DataPartsExchange protocol version {server_protocol_version}")
    path = Path(tmp_dir)
    if sink is None:
        sink = PartSink(path, fsync)
    elif sink.path != path:
        raise ValueError(f"the sink writes to {sink.path}, not {path}")
    try:
        return await _receive(
            _Body(stream), sink, server_protocol_version, expected_checksums, max_files, max_file_size,
            SpaceGuard(path.parent, max_part_bytes),
        )
    except BaseException:
        await asyncio.shield(sink.discard())
        raise


async def _receive(
    body: _Body,
    sink: PartSink,
    version: int,
    expected: Checksums | MinimalisticChecksums | None,
    max_files: int,
    max_file_size: int,
    space: SpaceGuard,
) -> ReceivedPart:
    sum_size = ttl = uuid = None
    part_type = "Wide"
    if version >= 1:
        sum_size = await body.u64("part size")
        await space.part_declared(sum_size)
    if version >= 2:
        ttl = (await body.string("ttl infos", 1 << 20)).decode("utf-8", "replace")
        if not ttl.startswith(TTL_INFOS_HEADER) or not _is_json_object(ttl[len(TTL_INFOS_HEADER):]):
            raise CorruptedDataError(f"Bad ttl infos in part body: {ttl[:40]!r}")
    if version >= 3:
        part_type = (await body.string("part type", 64)).decode("ascii", "replace")
        if part_type == "InMemory":
            raise UnsupportedPartFormatError("The sender's part is InMemory: only Wide and Compact parts are "
                                             "received")
        if part_type not in ("Wide", "Compact"):
            raise CorruptedDataError(f"Bad part type in part body: {part_type!r}")
    if version >= 5:
        uuid = (await body.exactly(36, "part uuid")).decode("ascii", "replace")
        if not _UUID_RE.fullmatch(uuid):
            raise CorruptedDataError(f"Bad part UUID in part body: {uuid!r}")
    if version >= 7:
        projections = await body.u64("projections count")
        if projections:
            raise CorruptedDataError(f"Parts with projections are not supported ({projections} sent)")

    n_files = await body.u64("number of files")
    if n_files > max_files:
        raise CorruptedDataError(f"Too many files in part body: {n_files}")
    names: set[str] = set()
    kept: dict[str, bytes] = {}
    for _ in range(n_files):
        raw = await body.string("file name", 4 * MAX_NAME_LENGTH)
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError as e:
            raise InsecurePathError(f"Bad file name in part: {raw!r}") from e
        check_file_name(name)
        if name in names:
            raise CorruptedDataError(f"File {name} sent twice in part body")
        names.add(name)
        size = await body.u64(f"size of {name}")
        if size > max_file_size:
            raise CorruptedDataError(f"File {name} in part body is too large: {size} bytes")
        if name in NO_CHECKSUM_FILES:  # not in sum_size: small text files
            if size > MAX_KEPT_FILE:
                raise CorruptedDataError(f"File {name} in part body is too large: {size} bytes")
        else:
            await space.file_declared(size, sum_size)
        data = await _receive_file(body, sink, name, size)
        if data is not None:
            kept[name] = data
    files = await sink.finish()
    if not await body.at_eof():
        raise CorruptedDataError(f"Unexpected data after the part body (after byte {body.count})")

    for required in (CHECKSUMS_FILE, COLUMNS_FILE):
        if required not in files:
            raise CorruptedDataError(f"No {required} in the transferred part")
    for name in (CHECKSUMS_FILE, COLUMNS_FILE):
        if name not in kept:
            kept[name] = await asyncio.to_thread((sink.path / name).read_bytes)
    try:
        columns_text = kept[COLUMNS_FILE].decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptedDataError(f"{COLUMNS_FILE} of the transferred part is not UTF-8") from e
    raw_checksums = kept[CHECKSUMS_FILE]
    checksums = Checksums.parse(raw_checksums)
    for name, c in checksums.files.items():
        got = files.get(name)
        if got is None:
            raise CorruptedDataError(f"No file {name} in the transferred part")
        if got.size != c.file_size:
            raise CorruptedDataError(f"Unexpected size of file {name} in the transferred part")
        if got.file_hash != c.file_hash and not fault_plant.planted("skip_fetch_checksum"):
            raise CorruptedDataError(f"Checksum mismatch for file {name} in the transferred part")
    extra = tuple(sorted(n for n in files if n not in checksums.files))
    unexpected = [n for n in extra if n not in NO_CHECKSUM_FILES]
    if unexpected:
        raise CorruptedDataError(f"Unexpected file {unexpected[0]} in the transferred part")
    if sum_size is not None and sum_size != checksums.total_size:
        raise CorruptedDataError(f"Part size {sum_size} sent, but its files add up to {checksums.total_size}")
    if isinstance(expected, MinimalisticChecksums):
        expected.check_equal(checksums, True)
    elif expected is not None:
        expected.check_equal(checksums, False)
    count = kept.get(COUNT_FILE)
    rows = int(count) if count is not None and count.isdigit() else None
    return ReceivedPart(
        sink.path, checksums, files, part_type, sum_size, ttl, uuid, body.count, extra, columns_text, rows
    )
