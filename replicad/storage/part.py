"""One part directory on disk: its small metadata files and whole-part verification.

A ClickHouse 18.16 Wide part (FACTS §5.1) holds, besides the column streams (``<stream>.bin`` +
``<stream>.mrk``): ``columns.txt``, ``checksums.txt``, ``count.txt``, ``primary.idx`` (only with a primary
key) and, when the table has a partition key, ``partition.dat`` and ``minmax_<col>.idx``.

:class:`PartDirectory` loads these lazily and re-hashes files against ``checksums.txt`` (:meth:`verify`).
Reading column data is :mod:`replicad.storage.reader`'s job, writing a part :mod:`replicad.storage.writer`'s.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from replicad.datatypes import DataType, escape_for_file_name, parse_type
from replicad.errors import CorruptedDataError
from replicad.model.cityhash import BytesLike, FileHasher, hash_file
from replicad.sql.expressions_lexer import unquote
from replicad.storage.checksums import Checksum, Checksums
from replicad.storage.compression import (
    BLOCK_OVERHEAD,
    CHECKSUM_SIZE,
    HEADER_SIZE,
    MAX_BLOCK_SIZE,
    read_block,
)

COLUMNS_FILE = "columns.txt"
CHECKSUMS_FILE = "checksums.txt"
COUNT_FILE = "count.txt"
PRIMARY_INDEX_FILE = "primary.idx"
PARTITION_FILE = "partition.dat"
COMPACT_DATA_FILE = "data.bin"
COMPACT_MARKS_FILES = ("data.mrk3", "data.cmrk3", "data.mrk4", "data.cmrk4")
PROJECTION_EXT = ".proj"
DATA_EXT = ".bin"
MARKS_EXT = ".mrk"
MARK_SIZE = 16  # two UInt64: offset of the block in the .bin file, offset inside the decompressed block

#: files that are part of a part but not listed in its checksums.txt
UNCHECKED_FILES = frozenset(
    {CHECKSUMS_FILE, COLUMNS_FILE, "default_compression_codec.txt", "metadata_version.txt",
     "columns_substreams.txt", "txn_version.txt", "uuid.txt", "delete-on-destroy.txt"}
)

_COLUMNS_HEADER = "columns format version: 1\n"

_BACKQUOTE_ESCAPES = {
    "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0", "\\": "\\\\", "`": "\\`",
}


def minmax_file_name(column: str) -> str:
    return f"minmax_{escape_for_file_name(column)}.idx"


def back_quote(name: str) -> str:
    """ClickHouse ``writeBackQuotedString``: backquotes, with ``\\b \\f \\n \\r \\t \\0 \\\\ \\```
    escaped."""
    return "`" + "".join(_BACKQUOTE_ESCAPES.get(ch, ch) for ch in name) + "`"


def _read_back_quoted(text: str, pos: int) -> tuple[str, int]:
    """Parse a backquoted name at ``text[pos]`` (backslash escapes and SQL-style doubled quotes)."""
    if pos >= len(text) or text[pos] != "`":
        raise CorruptedDataError(f"columns.txt: expected '`' at offset {pos}")
    i = pos + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == "`" and text[i + 1:i + 2] == "`":
            i += 2
        elif ch == "`":
            return unquote(text[pos:i + 1]), i + 1
        else:
            i += 1
    raise CorruptedDataError("columns.txt: unterminated backquoted name")


def columns_text(columns: Sequence[tuple[str, DataType]] | Sequence[tuple[str, str]]) -> str:
    """``columns.txt`` (NamesAndTypesList text): header, ``<N> columns:``, one `` `name` Type`` line each."""
    lines = [_COLUMNS_HEADER, f"{len(columns)} columns:\n"]
    for name, dtype in columns:
        type_text = dtype if isinstance(dtype, str) else dtype.name
        lines.append(f"{back_quote(name)} {type_text}\n")
    return "".join(lines)


def parse_columns_text(text: str) -> list[tuple[str, str]]:
    """Inverse of :func:`columns_text`: ``[(name, type text)]``; CorruptedDataError if malformed."""
    if not text.startswith(_COLUMNS_HEADER):
        raise CorruptedDataError("columns.txt: bad header")
    pos = len(_COLUMNS_HEADER)
    end = text.find(" columns:\n", pos)
    if end < 0 or not text[pos:end].isdigit():
        raise CorruptedDataError("columns.txt: bad column count line")
    count = int(text[pos:end])
    pos = end + len(" columns:\n")
    out: list[tuple[str, str]] = []
    for _ in range(count):
        name, pos = _read_back_quoted(text, pos)
        if pos >= len(text) or text[pos] != " ":
            raise CorruptedDataError(f"columns.txt: expected ' ' after column {name!r}")
        nl = text.find("\n", pos + 1)
        if nl < 0:
            raise CorruptedDataError(f"columns.txt: unterminated type of column {name!r}")
        type_text = text[pos + 1:nl]
        if "\t" in type_text:
            raise CorruptedDataError(f"columns.txt: bad type of column {name!r}")
        out.append((name, type_text))
        pos = nl + 1
    if pos != len(text):
        raise CorruptedDataError("columns.txt: trailing data")
    return out


_SIZES_SUFFIX = re.compile(r"\.size\d+")


def nested_table_name(column: str) -> str:
    """ClickHouse ``Nested::extractTableName``: the part before the first dot (``n`` of ``n.a``)."""
    i = column.find(".")
    return column if i <= 0 or i == len(column) - 1 else column[:i]


def stream_stem(column: str, suffix: str) -> str:
    """File stem (without ``.bin``/``.mrk``) of one substream of a column.

    Array sizes of a column whose name has a dot are stored under the nested table's name and shared
    by all its columns: ``n.a Array(T)`` and ``n.b Array(U)`` both use ``n.size0``.
    """
    if _SIZES_SUFFIX.fullmatch(suffix):
        return escape_for_file_name(nested_table_name(column)) + suffix
    return escape_for_file_name(column) + suffix


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that renames/creations inside it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_part_files(path: str | os.PathLike[str]) -> None:
    """fsync every file of a part directory, then the directory itself."""
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)


def create_file(path: str | os.PathLike[str], *, exclusive: bool = False) -> int:
    """A plain descriptor of a new (or truncated) file, open for writing; ``exclusive``: fail if it exists.
    ``open()`` adds an fstat, an ioctl and a buffered file object."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    return os.open(path, flags, 0o666)  # as open(): the umask decides


def write_all(fd: int, data: BytesLike) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path: str | os.PathLike[str], data: bytes, fsync: bool, *, exclusive: bool = False) -> None:
    """Write a whole (small) file, fsynced when ``fsync``; ``exclusive``: fail if it exists.  Plain
    ``os`` calls: open, write, close."""
    fd = create_file(path, exclusive=exclusive)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def hash_compressed_file(path: str | os.PathLike[str]) -> tuple[int, bytes, int, bytes]:
    """(file size, file hash, uncompressed size, uncompressed hash) of a ``.bin`` file, in one pass.

    Every block's checksum is verified on the way (CorruptedDataError otherwise); memory is bounded
    by one block.
    """
    name = os.path.basename(path)
    raw_hasher, plain = FileHasher(), FileHasher()
    with open(path, "rb") as f:
        while True:
            head = f.read(BLOCK_OVERHEAD)
            if not head:
                break
            block = head
            if len(head) == BLOCK_OVERHEAD:
                csize = int.from_bytes(head[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little")
                if HEADER_SIZE < csize <= MAX_BLOCK_SIZE:
                    block = head + f.read(csize - HEADER_SIZE)
            try:
                payload, _end = read_block(block, 0, name)
            except CorruptedDataError as e:
                raise type(e)(f"{e} (block at offset {raw_hasher.size})") from None
            raw_hasher.update(block)
            plain.update(payload)
    return raw_hasher.size, raw_hasher.digest(), plain.size, plain.digest()


@dataclass(frozen=True)
class PartDirectory:
    """A part directory (active, temporary or detached) and its metadata files, loaded on first use."""

    path: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> PartDirectory:
        return cls(Path(path))

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def read_bytes(self, name: str) -> bytes:
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            raise CorruptedDataError(f"part {self.name}: no file {name}") from None

    def files(self) -> list[str]:
        """Names of the regular files in the directory, sorted."""
        return sorted(e.name for e in os.scandir(self.path) if e.is_file())

    def preload(self) -> PartDirectory:
        """Read checksums.txt, columns.txt and count.txt now (blocking; call it in a worker thread), so that
        the event loop later finds them cached.  A file that cannot be read is left to fail on first use."""
        for read in (lambda: self.checksums, lambda: self.columns_text, lambda: self.rows):
            try:
                read()
            except (CorruptedDataError, OSError, ValueError):
                pass
        return self

    def known(self, checksums: Checksums, columns_text: str, rows: int,
              bytes_on_disk: int | None = None) -> PartDirectory:
        """The metadata a writer just wrote into this directory, taken as read (no file is opened, none is
        stat-ed): a fresh part need not read back its own checksums.txt, columns.txt and count.txt."""
        cache = self.__dict__  # where cached_property keeps its values
        cache["checksums"], cache["columns_text"], cache["rows"] = checksums, columns_text, rows
        if bytes_on_disk is not None:
            cache["bytes_on_disk"] = bytes_on_disk
        return self

    # ---- metadata files ------------------------------------------------------------------------------

    @cached_property
    def columns_text(self) -> str:
        return self.read_bytes(COLUMNS_FILE).decode("utf-8")

    @cached_property
    def column_types(self) -> list[tuple[str, str]]:
        """``[(name, type text)]`` from columns.txt."""
        return parse_columns_text(self.columns_text)

    @cached_property
    def columns(self) -> list[tuple[str, DataType]]:
        """``[(name, DataType)]`` from columns.txt."""
        return [(name, parse_type(t)) for name, t in self.column_types]

    @cached_property
    def checksums(self) -> Checksums:
        return Checksums.parse(self.read_bytes(CHECKSUMS_FILE))

    @cached_property
    def rows(self) -> int:
        """Rows from count.txt (decimal, no newline)."""
        text = self.read_bytes(COUNT_FILE)
        if not text.isdigit():
            raise CorruptedDataError(f"part {self.name}: bad count.txt {text[:32]!r}")
        return int(text)

    @cached_property
    def partition_dat(self) -> bytes | None:
        """Raw ``partition.dat`` (serializeBinary of each partition-key value) or None without one."""
        p = self.path / PARTITION_FILE
        return p.read_bytes() if p.exists() else None

    def minmax_bytes(self, column: str) -> bytes | None:
        """Raw ``minmax_<col>.idx`` (serializeBinary(min) ++ serializeBinary(max)) or None."""
        p = self.path / minmax_file_name(column)
        return p.read_bytes() if p.exists() else None

    def minmax(self, column: str, dtype: DataType) -> tuple[object, object] | None:
        """(min, max) of a partition-key column as Python values of the storage Arrow type."""
        data = self.minmax_bytes(column)
        if data is None:
            return None
        arr = dtype.deserialize({"": data}, 2)
        return arr[0].as_py(), arr[1].as_py()

    @cached_property
    def bytes_on_disk(self) -> int:
        return sum(e.stat().st_size for e in os.scandir(self.path) if e.is_file())

    # ---- verification --------------------------------------------------------------------------------

    def _verify_projection(self, name: str, expected: Checksum, check_uncompressed: bool) -> None:
        """A projection sub-part (``<p>.proj/``, current ClickHouse): verified as a part; its entry in
        checksums.txt holds its total size and total checksum (SipHash-128 over names and file hashes)."""
        sub = PartDirectory(self.path / name)
        sub.verify(check_uncompressed=check_uncompressed)
        lo, hi = sub.checksums.total_checksum()
        if (sub.checksums.total_size, struct.pack("<QQ", lo, hi)) != (expected.file_size, expected.file_hash):
            raise CorruptedDataError(f"part {self.name}: projection {name} does not match checksums.txt")

    def verify(self, *, check_uncompressed: bool = True, require_all_files_listed: bool = False) -> None:
        """Re-hash every file listed in checksums.txt; CorruptedDataError naming the first bad file.

        With ``check_uncompressed`` every compressed block is decompressed and checked too (block
        checksums, uncompressed size and hash).  With ``require_all_files_listed`` a file on disk that
        checksums.txt does not know is an error as well.
        """
        checksums = self.checksums
        for name, expected in sorted(checksums.files.items()):
            path = self.path / name
            if not path.exists():
                raise CorruptedDataError(f"part {self.name}: file {name} listed in checksums.txt is missing")
            if name.endswith(PROJECTION_EXT) and path.is_dir():
                self._verify_projection(name, expected, check_uncompressed)
                continue
            if expected.is_compressed and check_uncompressed:
                size, digest, usize, udigest = hash_compressed_file(path)
                if (name == COMPACT_DATA_FILE and usize == expected.uncompressed_size
                        and any(f in checksums.files for f in COMPACT_MARKS_FILES)):
                    # A Compact part hashes the plain data per codec and chains those hashes (CityHash128
                    # seeded with the previous one), in the writer's unordered map order: one codec gives
                    # file_hash(hash); with several, only the size and the file hash below can be checked.
                    udigest = expected.uncompressed_hash
                if (usize, udigest) != (expected.uncompressed_size, expected.uncompressed_hash):
                    raise CorruptedDataError(
                        f"part {self.name}: checksum mismatch for uncompressed data of {name}: "
                        f"expected size {expected.uncompressed_size} "
                        f"hash {expected.uncompressed_hash.hex()}, "
                        f"got size {usize} hash {udigest.hex()}"
                    )
            else:
                size, digest = hash_file(path)
            if size != expected.file_size:
                raise CorruptedDataError(
                    f"part {self.name}: file {name} has size {size}, checksums.txt says {expected.file_size}"
                )
            if digest != expected.file_hash:
                raise CorruptedDataError(
                    f"part {self.name}: checksum mismatch for file {name}: expected "
                    f"{expected.file_hash.hex()}, got {digest.hex()}"
                )
        if require_all_files_listed:
            extra = [f for f in self.files() if f not in checksums.files and f not in UNCHECKED_FILES]
            if extra:
                raise CorruptedDataError(f"part {self.name}: files not in checksums.txt: {', '.join(extra)}")
