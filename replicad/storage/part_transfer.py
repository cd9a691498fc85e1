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
runs in the loop's default executor) and sent with its ``Content-Length``; a larger one is streamed by a
thread of its own that reads 4 MiB pieces ahead of the socket (:func:`iter_part_body`).  Receiving is
:mod:`replicad.storage.part_receive`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import struct
import threading
from collections.abc import AsyncIterator, Generator, Sequence
from pathlib import Path
from typing import Protocol

from replicad import fault_plant
from replicad.errors import (
    CorruptedDataError,
    InsecurePathError,
    UnsupportedPartFormatError,
)
from replicad.model.cityhash import FileHasher, file_hash
from replicad.model.varint import encode_varuint
from replicad.native._files import read_files
from replicad.storage.checksums import Checksum, Checksums
from replicad.storage.part import COMPACT_DATA_FILE, COMPACT_MARKS_FILES

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
#: a small part's files read whole for its body add up to at most this (its checksummed files are at most
#: SMALL_PART_BYTES; checksums.txt, columns.txt and the few unchecksummed text files are small)
MAX_SMALL_BODY_FILES = 64 << 20
_U64 = struct.Struct("<Q")
_NAME_RE = re.compile(r"[A-Za-z0-9_.%+-]+")


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


def sendable_part_type(checksums: Checksums, protocol_version: int, part_name: str) -> str:
    """The part's type for the body (:func:`part_type_of`); UnsupportedPartFormatError when a client of
    ``protocol_version`` cannot read it (before v3 the body has no type: Wide only)."""
    part_type = part_type_of(checksums)
    if part_type != "Wide" and protocol_version < 3:
        raise UnsupportedPartFormatError(f"Part {part_name} is {part_type}: a DataPartsExchange client of "
                                         f"protocol {protocol_version} reads Wide parts only")
    return part_type


def _check_size(name: str, part_name: str, size: int, expected: Checksum | None) -> None:
    """CorruptedDataError when checksums.txt lists file ``name`` with another size."""
    if expected is not None and size != expected.file_size:
        raise CorruptedDataError(f"Unexpected size of file {name} in part {part_name}: "
                                 f"{size} instead of {expected.file_size}")


def _check_digest(name: str, part_name: str, digest: bytes, expected: Checksum | None) -> None:
    """CorruptedDataError when checksums.txt lists file ``name`` with another hash."""
    planted = fault_plant.planted("skip_fetch_checksum")  # test-only planted bug
    if expected is not None and digest != expected.file_hash and not planted:
        raise CorruptedDataError(f"Checksum mismatch for file {name} in part {part_name}")


def _whole_body(checksums: Checksums, protocol_version: int, part_type: str,
                files: Sequence[tuple[str, bytes, bytes]]) -> bytes:
    """A body of ``files`` given whole: (name, bytes, file hash), in the order to send."""
    out = [body_header(checksums, protocol_version, part_type), _U64.pack(len(files))]
    for name, data, digest in files:
        out += (_string(name.encode()), _U64.pack(len(data)), data, digest)
    return b"".join(out)


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
    part_type = sendable_part_type(checksums, protocol_version, base.name)
    buf = bytearray(body_header(checksums, protocol_version, part_type))
    buf += _U64.pack(len(names))
    for name in names:
        expected = checksums.files.get(name)
        with open(os.path.join(dir_text, check_file_name(name)), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            _check_size(name, base.name, size, expected)
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
        _check_digest(name, base.name, digest, expected)
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
    a file does not match checksums.txt (or changes size while read), OSError when one cannot be read.  The
    files are read by one native call (:func:`replicad.native._files.read_files`: the GIL let go once, not
    around each of ~80 system calls)."""
    base = Path(part_dir)
    dir_text = os.fspath(part_dir)
    part_type = sendable_part_type(checksums, protocol_version, base.name)
    required = sorted({*checksums.files, CHECKSUMS_FILE, COLUMNS_FILE})
    extra = sorted(NO_CHECKSUM_FILES - {CHECKSUMS_FILE, COLUMNS_FILE})  # sent where the part has them
    try:
        read = read_files(dir_text, [check_file_name(n) for n in (*required, *extra)], len(extra),
                          MAX_SMALL_BODY_FILES)
    except OSError as e:
        if e.errno == errno.EIO:
            raise CorruptedDataError(f"A file of part {base.name} changed size while being sent") from e
        raise
    out: list[tuple[str, bytes, bytes]] = []
    for name, data in sorted((n, d) for n, d in zip((*required, *extra), read, strict=True) if d is not None):
        expected = checksums.files.get(name)
        _check_size(name, base.name, len(data), expected)
        digest = file_hash(data)
        _check_digest(name, base.name, digest, expected)
        out.append((name, data, digest))
    return _whole_body(checksums, protocol_version, part_type, out)


def body_from_files(checksums: Checksums, protocol_version: int,
                    files: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The body of a part from its files held in memory (:mod:`replicad.storage.fresh_files`: a part just
    written whole), the same bytes as :func:`build_part_body` makes from its directory; None when the files
    are not exactly checksums.txt's, checksums.txt and columns.txt (the caller reads the directory then).
    Each checksummed file's size is checked against checksums.txt; its hash is the one there, which the
    writer computed from these very bytes."""
    names = sorted(name for name, _d in files)
    if names != sorted({*checksums.files, CHECKSUMS_FILE, COLUMNS_FILE}) or len(names) != len(files):
        return None
    part_type = part_type_of(checksums)
    if part_type != "Wide" and protocol_version < 3:
        return None
    out: list[tuple[str, bytes, bytes]] = []
    for name, data in sorted(files):
        expected = checksums.files.get(name)
        if expected is not None and len(data) != expected.file_size:
            return None
        out.append((name, data, expected.file_hash if expected is not None else file_hash(data)))
    return _whole_body(checksums, protocol_version, part_type, out)


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
