"""Receiving a DataPartsExchange body (its layout: :mod:`replicad.storage.part_transfer`).

The receiver validates every file name, holds the declared sizes to their limits and to the disk's free
space, checks every file's hash, requires the end of the body, then checks the received checksums.txt
against the files.  One parser of the body's framing, :func:`_frames` (a generator that asks its driver for
the body's next bytes), serves two drivers, so that both check the same things the same way:

* :func:`receive_part` streams a body of any size from the socket: the event loop parses it and hands the
  files' bytes to a :class:`replicad.storage.part_sink.PartSink` thread in bounded batches (memory: well
  under 1 MiB whatever the part);
* :func:`receive_whole_body` takes a small body already read whole (the sender said its ``Content-Length``,
  at most :data:`WHOLE_BODY_MAX_BYTES`): framing, hashes and checks in one blocking call, for a worker
  thread, then every file in one native call (``write_files``), nothing written when a check fails.  A
  small part's fetch spent more on the streamed path's per-file steps on the event loop and per-file system
  calls in the sink's thread than on its bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import struct
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field, replace
from pathlib import Path

from replicad import fault_plant
from replicad.errors import CorruptedDataError, InsecurePathError, UnsupportedPartFormatError
from replicad.model.cityhash import file_hash
from replicad.native._files import write_files
from replicad.storage import part_sink
from replicad.storage.checksums import Checksums, MinimalisticChecksums
from replicad.storage.part_sink import PartSink, ReceivedFile, Write
from replicad.storage.part_transfer import (
    CHECKSUMS_FILE,
    COLUMNS_FILE,
    COUNT_FILE,
    MAX_COUNT_FILE,
    MAX_FILE_SIZE,
    MAX_FILES,
    MAX_KEPT_FILE,
    MAX_NAME_LENGTH,
    MAX_PART_BYTES,
    NO_CHECKSUM_FILES,
    RECEIVE_MAX_PROTOCOL_VERSION,
    TTL_INFOS_HEADER,
    AsyncByteStream,
    check_file_name,
)
from replicad.storage.prepared_dirs import prepared_for
from replicad.storage.space_guard import SpaceGuard

__all__ = ["WHOLE_BODY_MAX_BYTES", "ReceivedPart", "receive_part", "receive_whole_body"]

#: a body of at most this many bytes, whose length the sender gave, is read whole and received by
#: :func:`receive_whole_body` (the senders' whole answers are parts of up to 1 MiB of files plus
#: checksums.txt and columns.txt); the memory a lying sender can make a fetch hold
WHOLE_BODY_MAX_BYTES = 2 << 20
_HASH_BYTES = 16
_U64 = struct.Struct("<Q")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


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
    replaced_stale: bool = False  # a directory left at ``path`` (an earlier fetch's) was removed first

    @property
    def written(self) -> tuple[Checksums, str, int, int] | None:
        """(checksums, columns.txt, rows, bytes on disk) as ``PartStore.precommit`` takes them instead of
        reading the files back; None when count.txt was not kept (a part without one)."""
        if self.rows is None:
            return None
        return self.checksums, self.columns_text, self.rows, sum(f.size for f in self.files.values())


# ------------------------------------------------------------------------------------------ the framing


@dataclass(frozen=True, slots=True)
class _Need:
    """The parser wants the body's next ``n`` bytes (sent back to it)."""

    n: int
    what: str


@dataclass(frozen=True, slots=True)
class _Size:
    """A declared size to hold against the limits and the free space: the part's (``part``) or a file's."""

    size: int
    sum_size: int | None
    part: bool


@dataclass(frozen=True, slots=True)
class _File:
    """A file's ``size`` bytes and then its 16-byte hash come next: the driver takes them, checks the hash
    and sends the bytes back when ``keep`` (checksums.txt, columns.txt, count.txt), else None."""

    name: str
    size: int
    keep: bool


@dataclass(frozen=True)
class _Framing:
    """What the body said besides its files."""

    sum_size: int | None
    ttl: str | None
    uuid: str | None
    part_type: str
    kept: dict[str, bytes]


_Frames = Generator[_Need | _Size | _File, bytes | None, _Framing]
_Take = Generator[_Need | _Size | _File, bytes | None, bytes]


def _take(n: int, what: str) -> _Take:
    got = yield _Need(n, what)
    return got if got is not None else b""


def _u64(what: str) -> Generator[_Need | _Size | _File, bytes | None, int]:
    return int(_U64.unpack((yield from _take(8, what)))[0])


def _string(what: str, limit: int) -> _Take:
    n = shift = 0
    for _ in range(10):
        b = (yield from _take(1, what))[0]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    else:
        raise CorruptedDataError(f"Bad VarUInt in part body ({what})")
    if n > limit:
        raise CorruptedDataError(f"Too long {what} in part body: {n} bytes")
    return (yield from _take(n, what))


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _frames(version: int, max_files: int, max_file_size: int) -> _Frames:
    """The body's fields and file list, checked as they come (every error is CorruptedDataError, or
    InsecurePathError for a file name, or UnsupportedPartFormatError for an in-memory part)."""
    if not 0 <= version <= RECEIVE_MAX_PROTOCOL_VERSION:
        raise CorruptedDataError(f"Unsupported DataPartsExchange protocol version {version}")
    sum_size = ttl = uuid = None
    part_type = "Wide"
    if version >= 1:
        sum_size = yield from _u64("part size")
        yield _Size(sum_size, None, True)
    if version >= 2:
        ttl = (yield from _string("ttl infos", 1 << 20)).decode("utf-8", "replace")
        if not ttl.startswith(TTL_INFOS_HEADER) or not _is_json_object(ttl[len(TTL_INFOS_HEADER):]):
            raise CorruptedDataError(f"Bad ttl infos in part body: {ttl[:40]!r}")
    if version >= 3:
        part_type = (yield from _string("part type", 64)).decode("ascii", "replace")
        if part_type == "InMemory":
            raise UnsupportedPartFormatError("The sender's part is InMemory: only Wide and Compact parts are "
                                             "received")
        if part_type not in ("Wide", "Compact"):
            raise CorruptedDataError(f"Bad part type in part body: {part_type!r}")
    if version >= 5:
        uuid = (yield from _take(36, "part uuid")).decode("ascii", "replace")
        if not _UUID_RE.fullmatch(uuid):
            raise CorruptedDataError(f"Bad part UUID in part body: {uuid!r}")
    if version >= 7:
        projections = yield from _u64("projections count")
        if projections:
            raise CorruptedDataError(f"Parts with projections are not supported ({projections} sent)")
    n_files = yield from _u64("number of files")
    if n_files > max_files:
        raise CorruptedDataError(f"Too many files in part body: {n_files}")
    names: set[str] = set()
    kept: dict[str, bytes] = {}
    for _ in range(n_files):
        raw = yield from _string("file name", 4 * MAX_NAME_LENGTH)
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError as e:
            raise InsecurePathError(f"Bad file name in part: {raw!r}") from e
        check_file_name(name)
        if name in names:
            raise CorruptedDataError(f"File {name} sent twice in part body")
        names.add(name)
        size = yield from _u64(f"size of {name}")
        if size > max_file_size:
            raise CorruptedDataError(f"File {name} in part body is too large: {size} bytes")
        if name in NO_CHECKSUM_FILES:  # not in sum_size: small text files
            if size > MAX_KEPT_FILE:
                raise CorruptedDataError(f"File {name} in part body is too large: {size} bytes")
        else:
            yield _Size(size, sum_size, False)
        keep = (name in (CHECKSUMS_FILE, COLUMNS_FILE) and size <= MAX_KEPT_FILE) or (
            name == COUNT_FILE and size <= MAX_COUNT_FILE)
        data = yield _File(name, size, keep)
        if data is not None:
            kept[name] = data
    return _Framing(sum_size, ttl, uuid, part_type, kept)


def _verified(path: Path, framing: _Framing, files: dict[str, ReceivedFile], body_size: int,
              expected: Checksums | MinimalisticChecksums | None) -> ReceivedPart:
    """The received files against the received checksums.txt and ``expected`` (the replicas' registration)."""
    kept = framing.kept
    try:
        columns_text = kept[COLUMNS_FILE].decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptedDataError(f"{COLUMNS_FILE} of the transferred part is not UTF-8") from e
    checksums = Checksums.parse(kept[CHECKSUMS_FILE])
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
    if framing.sum_size is not None and framing.sum_size != checksums.total_size:
        raise CorruptedDataError(f"Part size {framing.sum_size} sent, but its files add up to "
                                 f"{checksums.total_size}")
    if isinstance(expected, MinimalisticChecksums):
        expected.check_equal(checksums, True)
    elif expected is not None:
        expected.check_equal(checksums, False)
    count = kept.get(COUNT_FILE)
    rows = int(count) if count is not None and count.isdigit() else None
    return ReceivedPart(path, checksums, files, framing.part_type, framing.sum_size, framing.ttl,
                        framing.uuid, body_size, extra, columns_text, rows)


def _require_lists(files: dict[str, ReceivedFile]) -> None:
    for required in (CHECKSUMS_FILE, COLUMNS_FILE):
        if required not in files:
            raise CorruptedDataError(f"No {required} in the transferred part")


# ------------------------------------------------------------------------------------------- streaming


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


async def _receive_file(body: _Body, sink: PartSink, file: _File) -> bytes | None:
    """Hand one file's bytes to ``sink`` in batches; returns them when the parser keeps them."""
    name, keep = file.name, file.keep
    what = f"file {name}"
    kept: list[memoryview] = []
    remaining = file.size
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
    await sink.add(Write(name, pieces, got, first, True, await body.exactly(_HASH_BYTES, f"hash of {name}")))
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
        return await _receive(_Body(stream), sink, server_protocol_version, expected_checksums, max_files,
                              max_file_size, SpaceGuard(path.parent, max_part_bytes))
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
    frames = _frames(version, max_files, max_file_size)
    reply: bytes | None = None
    try:
        while True:
            event = frames.send(reply)
            if isinstance(event, _Need):
                reply = await body.exactly(event.n, event.what)
            elif isinstance(event, _Size):
                reply = None
                await (space.part_declared(event.size) if event.part
                       else space.file_declared(event.size, event.sum_size))
            else:
                reply = await _receive_file(body, sink, event)
    except StopIteration as stop:
        framing: _Framing = stop.value
    files = await sink.finish()
    if not await body.at_eof():
        raise CorruptedDataError(f"Unexpected data after the part body (after byte {body.count})")
    _require_lists(files)
    for name in (CHECKSUMS_FILE, COLUMNS_FILE):  # larger than MAX_KEPT_FILE: read back
        if name not in framing.kept:
            framing.kept[name] = await asyncio.to_thread((sink.path / name).read_bytes)
    return _verified(sink.path, framing, files, body.count, expected)


# ----------------------------------------------------------------------------------------------- whole


def receive_whole_body(
    data: bytes,
    tmp_dir: str | os.PathLike[str],
    server_protocol_version: int = 0,
    expected_checksums: Checksums | MinimalisticChecksums | None = None,
    *,
    fsync: bool = False,
    max_files: int = MAX_FILES,
    max_file_size: int = MAX_FILE_SIZE,
    max_part_bytes: int = MAX_PART_BYTES,
    prepared_in: Path | None = None,
    replace_stale: bool = False,
) -> ReceivedPart:
    """(blocking) :func:`receive_part` for a body held whole in ``data``: the same checks and errors, every
    one of them made before anything is written; then ``tmp_dir`` and its files in one native call.  A
    directory already at ``tmp_dir`` is an error, or removed first with ``replace_stale``.  ``prepared_in``:
    the data path whose directories made ahead (storage/prepared_dirs.py) the part may take."""
    path = Path(tmp_dir)
    view = memoryview(data)
    end = len(view)
    pos = 0
    space = SpaceGuard(path.parent, max_part_bytes)
    files: dict[str, ReceivedFile] = {}
    entries: list[tuple[str, memoryview]] = []
    frames = _frames(server_protocol_version, max_files, max_file_size)
    reply: bytes | None = None
    try:
        while True:
            event = frames.send(reply)
            if isinstance(event, _Need):
                if pos + event.n > end:
                    raise CorruptedDataError(f"Truncated part body: {event.what} cut off at byte {end}")
                reply = bytes(view[pos:pos + event.n])
                pos += event.n
            elif isinstance(event, _Size):
                reply = None
                if event.part:
                    space.part_declared_now(event.size)
                else:
                    space.file_declared_now(event.size, event.sum_size)
            else:
                stop = pos + event.size
                if stop + _HASH_BYTES > end:
                    what = f"file {event.name}" if stop > end else f"hash of {event.name}"
                    raise CorruptedDataError(f"Truncated part body: {what} cut off at byte {end}")
                piece = view[pos:stop]
                digest = file_hash(piece)
                if digest != view[stop:stop + _HASH_BYTES] and not fault_plant.planted("skip_fetch_checksum"):
                    raise CorruptedDataError(
                        f"Checksum mismatch for file {event.name} transferred from other replica")
                files[event.name] = ReceivedFile(event.size, digest)
                entries.append((event.name, piece))
                pos = stop + _HASH_BYTES
                reply = bytes(piece) if event.keep else None
    except StopIteration as stop_iteration:
        framing: _Framing = stop_iteration.value
    if pos != end:
        raise CorruptedDataError(f"Unexpected data after the part body (after byte {pos})")
    _require_lists(files)
    received = _verified(path, framing, files, pos, expected_checksums)
    replaced = _write_directory(path, entries, fsync, prepared_in, replace_stale)
    return replace(received, replaced_stale=True) if replaced else received


def _write_directory(path: Path, entries: list[tuple[str, memoryview]], fsync: bool, prepared_in: Path | None,
                     replace_stale: bool) -> bool:
    """``path`` with its files (into a directory made ahead when one holds exactly these names); True when a
    stale directory was removed first.  A failure after the directory was made removes it."""
    pool = prepared_for(prepared_in, path.parent) if prepared_in is not None else None
    ready = pool.take((name for name, _d in entries), path.parent) if pool is not None else None
    if ready is not None:
        try:
            if os.path.lexists(path):
                raise FileExistsError(path)
            os.rename(ready, path)
        except OSError:
            shutil.rmtree(ready, True)
            ready = None
    replaced = False
    try:
        if ready is not None:
            write_files(path, entries, fsync, False, True)
            return False
        try:
            write_files(path, entries, fsync, True)
        except FileExistsError as e:
            if not replace_stale or e.filename != str(path):
                raise
            shutil.rmtree(path, True)
            replaced = True
            write_files(path, entries, fsync, True)
    except FileExistsError as e:
        if e.filename == str(path):  # not ours: left as it is
            raise
        shutil.rmtree(path, True)
        raise
    except BaseException:
        shutil.rmtree(path, True)
        raise
    return replaced
