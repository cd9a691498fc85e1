"""A part's checksums: ``checksums.txt`` (versions 2–4) and the minimalistic form kept in ZooKeeper.

``checksums.txt`` = ``checksums format version: N\\n`` + body:

* v2 (text): ``<n> files:\\n`` then per file
  ``<name>\\n\\tsize: <s>\\n\\thash: <lo> <hi>\\n\\tcompressed: <0|1>``
  [``\\n\\tuncompressed size: <s>\\n\\tuncompressed hash: <lo> <hi>``] ``\\n`` (decimal numbers);
* v3 (binary): VarUInt n, per file String name, VarUInt size, 16-byte hash, UInt8 is_compressed
  [VarUInt uncompressed size, 16-byte uncompressed hash];
* v4: the v3 body in LZ4 compressed blocks of at most 64 KiB — what 18.16 writes and what we write.

The ZooKeeper ``parts/<p>/checksums`` node holds v5 (``minimalistic``): VarUInt number of compressed
files, VarUInt number of uncompressed files, then three SipHash-128 values over (length-prefixed name,
hash) of all files / uncompressed files / compressed files' uncompressed hashes — or a full v2–v4 text
when use_minimalistic_checksums_in_zookeeper=0.  Files are always in byte order of their names.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Self

from replicad.errors import CorruptedDataError
from replicad.model.cityhash import file_hash
from replicad.model.siphash import SipHash
from replicad.model.varint import encode_varuint
from replicad.native import _checksums
from replicad.storage.compression import compress_block, decompress_all

HEADER_PREFIX = b"checksums format version: "
MINIMALISTIC_VERSION = 5
PART_HEADER_PREFIX = b"part header format version: 1\n"
V4_BLOCK_SIZE = 1 << 16  # 18.16 compresses checksums.txt through a 64 KiB buffer
ZERO_HASH = bytes(16)
_MAX_FILES = 1 << 20
_MAX_NAME = 4096


class _Reader:
    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, pos: int, what: str) -> None:
        self.data, self.pos, self.what = data, pos, what

    def fail(self, msg: str) -> CorruptedDataError:
        return CorruptedDataError(f"cannot parse {self.what}: {msg} at position {self.pos}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail("unexpected end of data")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def varuint(self) -> int:
        result = shift = 0
        for _ in range(10):
            b = self.take(1)[0]
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result & 0xFFFFFFFFFFFFFFFF
            shift += 7
        raise self.fail("VarUInt too long")

    def expect(self, s: bytes) -> None:
        if self.take(len(s)) != s:
            self.pos -= len(s)
            raise self.fail(f"expected {s!r}")

    def uint_text(self) -> int:
        start = self.pos
        while self.pos < len(self.data) and 0x30 <= self.data[self.pos] <= 0x39:
            self.pos += 1
        if self.pos == start or self.pos - start > 20:
            raise self.fail("expected an unsigned number")
        v = int(self.data[start : self.pos])
        if v > 0xFFFFFFFFFFFFFFFF:
            raise self.fail("number out of range")
        return v

    def until(self, stops: bytes) -> bytes:
        start = self.pos
        while self.pos < len(self.data) and self.data[self.pos] not in stops:
            self.pos += 1
        return self.data[start : self.pos]

    def at_end(self) -> bool:
        return self.pos == len(self.data)


def _name(raw: bytes, r: _Reader) -> str:
    if not raw or len(raw) > _MAX_NAME:
        raise r.fail("bad file name length")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise r.fail("file name is not UTF-8") from e


def _hash_text(h: bytes) -> bytes:
    lo, hi = struct.unpack("<QQ", h)
    return b"%d %d" % (lo, hi)


@dataclass(frozen=True, slots=True)
class Checksum:
    """One file's entry.  Hashes are ClickHouse file hashes (16 bytes, low word first)."""

    file_size: int
    file_hash: bytes
    is_compressed: bool = False
    uncompressed_size: int = 0
    uncompressed_hash: bytes = ZERO_HASH

    def __post_init__(self) -> None:
        if len(self.file_hash) != 16 or len(self.uncompressed_hash) != 16:
            raise ValueError("hashes must be 16 bytes")
        if not (0 <= self.file_size < 1 << 64 and 0 <= self.uncompressed_size < 1 << 64):
            raise ValueError("sizes must be UInt64")

    def check_equal(self, other: Checksum, have_uncompressed: bool, name: str) -> None:
        """ClickHouse's per-file comparison; CorruptedDataError with its wording on mismatch."""
        if self.is_compressed and have_uncompressed:
            if not other.is_compressed:
                raise CorruptedDataError(f"No uncompressed checksum for file {name}")
            if other.uncompressed_size != self.uncompressed_size:
                raise CorruptedDataError(f"Unexpected uncompressed size of file {name} in data part")
            if other.uncompressed_hash != self.uncompressed_hash:
                raise CorruptedDataError(f"Checksum mismatch for uncompressed file {name} in data part")
            return
        if other.file_size != self.file_size:
            raise CorruptedDataError(f"Unexpected size of file {name} in data part")
        if other.file_hash != self.file_hash:
            raise CorruptedDataError(f"Checksum mismatch for file {name} in data part")


@dataclass(frozen=True)
class Checksums:
    """All files of a part except checksums.txt and columns.txt, by name."""

    files: Mapping[str, Checksum] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # keep a private sorted copy: iteration order = ClickHouse's std::map order (bytes of the name)
        object.__setattr__(self, "files", dict(sorted(self.files.items())))

    # ------------------------------------------------------------------ reading

    @classmethod
    def parse(cls, data: bytes) -> Self:
        """Parse checksums.txt content of format version 2, 3 or 4 (whole input, nothing may follow)."""
        r = _Reader(bytes(data), 0, "checksums.txt")
        version = _read_header(r)
        out = cls._parse_body(r, version)
        if not r.at_end():
            raise r.fail("unexpected data after the checksums")
        return out

    @classmethod
    def _parse_body(cls, r: _Reader, version: int) -> Self:
        if version == 2:
            return cls(_read_v2(r))
        if version == 3:
            return cls(_read_v3(r))
        if version == 4:
            plain = decompress_all(r.data[r.pos :], "checksums.txt")
            inner = _Reader(plain, 0, "checksums.txt (decompressed)")
            files = _read_v3(inner)
            if not inner.at_end():
                raise inner.fail("unexpected data after the checksums")
            r.pos = len(r.data)
            return cls(files)
        if version == 1:
            raise r.fail("checksums format version 1 is too old")
        raise r.fail(f"unknown checksums format version {version}")

    # ------------------------------------------------------------------ writing

    def v3_body(self) -> bytes:
        return _checksums.v3_body(self.files)

    def v3_body_python(self) -> bytes:
        """:meth:`v3_body` in Python (what the native encoder is tested against)."""
        out = bytearray(encode_varuint(len(self.files)))
        for name, c in self.files.items():
            raw = name.encode()
            out += encode_varuint(len(raw)) + raw + encode_varuint(c.file_size) + c.file_hash
            out.append(1 if c.is_compressed else 0)
            if c.is_compressed:
                out += encode_varuint(c.uncompressed_size) + c.uncompressed_hash
        return bytes(out)

    def to_bytes(self) -> bytes:
        """checksums.txt exactly as 18.16 writes it (version 4, LZ4 blocks of at most 64 KiB)."""
        body = self.v3_body()
        blocks = [
            compress_block(body[i : i + V4_BLOCK_SIZE], "lz4") for i in range(0, len(body), V4_BLOCK_SIZE)
        ]
        return HEADER_PREFIX + b"4\n" + b"".join(blocks)

    def to_v2_text(self) -> bytes:
        """The old text form (version 2); only for tests and debugging — 18.16 reads it."""
        out = [HEADER_PREFIX + b"2\n%d files:\n" % len(self.files)]
        for name, c in self.files.items():
            out.append(
                b"%s\n\tsize: %d\n\thash: %s\n\tcompressed: %d"
                % (name.encode(), c.file_size, _hash_text(c.file_hash), c.is_compressed)
            )
            if c.is_compressed:
                out.append(
                    b"\n\tuncompressed size: %d\n\tuncompressed hash: %s"
                    % (c.uncompressed_size, _hash_text(c.uncompressed_hash))
                )
            out.append(b"\n")
        return b"".join(out)

    # ------------------------------------------------------------------ derived values

    @property
    def total_size(self) -> int:
        """Σ file_size (what DataPartsExchange v≥1 sends as the part size)."""
        return sum(c.file_size for c in self.files.values())

    def minimalistic(self) -> MinimalisticChecksums:
        return MinimalisticChecksums.from_checksums(self)

    def minimalistic_text(self) -> bytes:
        """The v5 value of ZooKeeper's ``parts/<p>/checksums`` (binary despite the name).  Made once per
        object (``files`` never changes): an insert's writer thread makes it while the block-number lock is
        being taken, and the commit on the loop finds it ready."""
        text: bytes | None = self.__dict__.get("_minimalistic_text")
        if text is None:
            text = self.minimalistic().to_bytes()
            object.__setattr__(self, "_minimalistic_text", text)
        return text

    def total_checksum(self) -> tuple[int, int]:
        """SipHash-128 (lo, hi) over (name, file hash) of every file = minimalistic hash_of_all_files."""
        h = SipHash()
        for name, c in self.files.items():
            h.update_string(name.encode())
            h.update(c.file_hash)
        return h.get128()

    def total_checksum_hex(self) -> str:
        """``getTotalChecksumHex``: 32 upper-case hex digits, high word first (REPLACE_RANGE/ATTACH_PART)."""
        lo, hi = self.total_checksum()
        return f"{hi:016X}{lo:016X}"

    def data_only_hash(self) -> tuple[int, int]:
        """SipHash-128 (lo, hi) over the .bin files' (name, uncompressed size, uncompressed hash): the
        insert block_id is ``f"{partition_id}_{lo}_{hi}"``."""
        h = SipHash()
        for name, c in self.files.items():
            if name.endswith(".bin"):
                h.update_string(name.encode())
                h.update_u64(c.uncompressed_size)
                h.update(c.uncompressed_hash)
        return h.get128()

    def check_equal(self, other: Checksums, have_uncompressed: bool = False) -> None:
        """``other`` must list exactly the same files with the same sizes and hashes (with
        ``have_uncompressed``, compressed files are compared by their uncompressed size/hash)."""
        for name in other.files:
            if name not in self.files:
                raise CorruptedDataError(f"Unexpected file {name} in data part")
        for name, c in self.files.items():
            theirs = other.files.get(name)
            if theirs is None:
                raise CorruptedDataError(f"No file {name} in data part")
            c.check_equal(theirs, have_uncompressed, name)


def _read_header(r: _Reader) -> int:
    r.expect(HEADER_PREFIX)
    version = r.uint_text()
    r.expect(b"\n")
    return version


def _read_v2(r: _Reader) -> dict[str, Checksum]:
    count = r.uint_text()
    r.expect(b" files:\n")
    if count > _MAX_FILES:
        raise r.fail("too many files")
    files: dict[str, Checksum] = {}
    for _ in range(count):
        name = _name(r.until(b"\t\n"), r)
        r.expect(b"\n\tsize: ")
        size = r.uint_text()
        r.expect(b"\n\thash: ")
        h = _text_hash(r)
        r.expect(b"\n\tcompressed: ")
        flag = r.uint_text()
        if flag > 1:
            raise r.fail("compressed flag must be 0 or 1")
        usize, uhash = 0, ZERO_HASH
        if flag:
            r.expect(b"\n\tuncompressed size: ")
            usize = r.uint_text()
            r.expect(b"\n\tuncompressed hash: ")
            uhash = _text_hash(r)
        r.expect(b"\n")
        files[name] = Checksum(size, h, bool(flag), usize, uhash)
    return files


def _text_hash(r: _Reader) -> bytes:
    lo = r.uint_text()
    r.expect(b" ")
    hi = r.uint_text()
    return struct.pack("<QQ", lo, hi)


def _read_v3(r: _Reader) -> dict[str, Checksum]:
    count = r.varuint()
    if count > _MAX_FILES:
        raise r.fail("too many files")
    files: dict[str, Checksum] = {}
    for _ in range(count):
        name = _name(r.take(r.varuint()), r)
        size = r.varuint()
        h = r.take(16)
        flag = r.take(1)[0]
        if flag > 1:
            raise r.fail("compressed flag must be 0 or 1")
        usize, uhash = 0, ZERO_HASH
        if flag:
            usize = r.varuint()
            uhash = r.take(16)
        files[name] = Checksum(size, h, bool(flag), usize, uhash)
    return files


@dataclass(frozen=True)
class MinimalisticChecksums:
    """Totals of a part's checksums (``checksums format version: 5``).  ``full`` is set when the value
    was parsed from a full checksums text (ZooKeeper with use_minimalistic_checksums_in_zookeeper=0)."""

    num_compressed_files: int
    num_uncompressed_files: int
    hash_of_all_files: bytes
    hash_of_uncompressed_files: bytes
    uncompressed_hash_of_compressed_files: bytes
    full: Checksums | None = field(default=None, compare=False)

    @classmethod
    def from_checksums(cls, cs: Checksums) -> Self:
        h_all, h_plain, h_comp = SipHash(), SipHash(), SipHash()
        n_comp = n_plain = 0
        for name, c in cs.files.items():
            raw = name.encode()
            h_all.update_string(raw)
            h_all.update(c.file_hash)
            if c.is_compressed:
                n_comp += 1
                h_comp.update_string(raw)
                h_comp.update(c.uncompressed_hash)
            else:
                n_plain += 1
                h_plain.update_string(raw)
                h_plain.update(c.file_hash)
        return cls(n_comp, n_plain, h_all.digest128(), h_plain.digest128(), h_comp.digest128())

    @classmethod
    def parse(cls, data: bytes) -> Self:
        """A ZooKeeper ``parts/<p>/checksums`` value: v5, or a full v2–v4 checksums text."""
        r = _Reader(bytes(data), 0, "part checksums from ZooKeeper")
        version = _read_header(r)
        if version > MINIMALISTIC_VERSION:
            raise r.fail(f"unknown checksums format version {version}")
        if version < MINIMALISTIC_VERSION:
            full = Checksums._parse_body(r, version)
            out = dataclasses.replace(cls.from_checksums(full), full=full)
        else:
            out = cls._read_body(r)
        if not r.at_end():
            raise r.fail("unexpected data after the checksums")
        return out

    @classmethod
    def _read_body(cls, r: _Reader) -> Self:
        n_comp = r.varuint()
        n_plain = r.varuint()
        return cls(n_comp, n_plain, r.take(16), r.take(16), r.take(16))

    def body(self) -> bytes:
        """The serialization without the version line (as embedded in a part header node)."""
        return (
            encode_varuint(self.num_compressed_files)
            + encode_varuint(self.num_uncompressed_files)
            + self.hash_of_all_files
            + self.hash_of_uncompressed_files
            + self.uncompressed_hash_of_compressed_files
        )

    def to_bytes(self) -> bytes:
        return HEADER_PREFIX + b"5\n" + self.body()

    def check_equal(
        self, other: MinimalisticChecksums | Checksums, check_uncompressed_hash_in_compressed_files: bool
    ) -> None:
        """ClickHouse's comparison of two replicas' checksums; CorruptedDataError on mismatch."""
        theirs = (
            other if isinstance(other, MinimalisticChecksums) else MinimalisticChecksums.from_checksums(other)
        )
        if self.full is not None and theirs.full is not None:
            self.full.check_equal(theirs.full, check_uncompressed_hash_in_compressed_files)
        if (self.num_compressed_files, self.num_uncompressed_files) != (
            theirs.num_compressed_files,
            theirs.num_uncompressed_files,
        ):
            raise CorruptedDataError(
                f"Different number of files: {theirs.num_compressed_files} compressed (expected "
                f"{self.num_compressed_files}) and {theirs.num_uncompressed_files} uncompressed ones "
                f"(expected {self.num_uncompressed_files})"
            )
        errors = []
        if self.hash_of_uncompressed_files != theirs.hash_of_uncompressed_files:
            errors.append("hash of uncompressed files doesn't match")
        if check_uncompressed_hash_in_compressed_files:
            if self.uncompressed_hash_of_compressed_files != theirs.uncompressed_hash_of_compressed_files:
                errors.append("uncompressed hash of compressed files doesn't match")
        elif self.hash_of_all_files != theirs.hash_of_all_files:
            errors.append("total hash of all files doesn't match")
        if errors:
            raise CorruptedDataError("Checksums of parts don't match: " + ", ".join(errors))


@dataclass(frozen=True)
class PartHeader:
    """NEW-style single-node part value (use_minimalistic_part_header_in_zookeeper=1):
    ``part header format version: 1\\n`` + SipHash-128 of the columns text + minimalistic body
    [+ ``block_id: <id>\\n`` in recent versions]."""

    columns_hash: bytes
    checksums: MinimalisticChecksums
    block_id: str | None = None

    @classmethod
    def from_parts(cls, columns_text: str, checksums: Checksums, block_id: str | None = None) -> Self:
        return cls(SipHash().update(columns_text.encode()).digest128(), checksums.minimalistic(), block_id)

    @classmethod
    def parse(cls, data: bytes) -> Self:
        r = _Reader(bytes(data), 0, "part header")
        r.expect(PART_HEADER_PREFIX)
        columns_hash = r.take(16)
        mc = MinimalisticChecksums._read_body(r)
        block_id = None
        if not r.at_end():
            r.expect(b"block_id: ")
            raw = r.until(b"\n")
            r.expect(b"\n")
            if not r.at_end():
                raise r.fail("unexpected data after the part header")
            block_id = raw.decode("utf-8", "replace")
        return cls(columns_hash, mc, block_id)

    def to_bytes(self) -> bytes:
        out = PART_HEADER_PREFIX + self.columns_hash + self.checksums.body()
        if self.block_id is not None:
            out += b"block_id: " + self.block_id.encode() + b"\n"
        return out


def plain_checksum(data: bytes) -> Checksum:
    """Entry for an uncompressed file (count.txt, .mrk, primary.idx, ...) with these contents."""
    return Checksum(len(data), file_hash(data))
