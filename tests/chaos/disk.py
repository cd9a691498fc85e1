"""Parts on disk, read without replicad's code: part names and containment, the directories of a table,
file digests, and ``checksums.txt`` decoded the way ClickHouse compares replicas (uncompressed contents)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

PART_RE = re.compile(r"^([^_]+)_(\d+)_(\d+)_(\d+)(?:_(\d+))?$")


def parse_part(name: str) -> tuple[str, int, int, int, int] | None:
    """(partition, min block, max block, level, mutation version or 0)."""
    m = PART_RE.match(name)
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5) or 0)


def covers(a: str, b: str) -> bool:
    """``a`` contains ``b`` (ClickHouse's MergeTreePartInfo::contains)."""
    pa, pb = parse_part(a), parse_part(b)
    return bool(pa and pb and pa[0] == pb[0] and pa[1] <= pb[1] and pb[2] <= pa[2] and pa[3] >= pb[3]
                and pa[4] >= pb[4])


def maximal(names: Sequence[str]) -> set[str]:
    """The parts not covered by another one (what a replica serves)."""
    named = [n for n in names if parse_part(n)]
    return {n for n in named if not any(o != n and covers(o, n) for o in named)}


def disk_parts(table_dir: Path) -> list[str]:
    if not table_dir.is_dir():
        return []
    return sorted(p.name for p in table_dir.iterdir() if p.is_dir() and parse_part(p.name))


def file_digests(part_dir: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(part_dir.iterdir())
            if f.is_file()}


def _varuint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def minimal_checksums(part_dir: Path) -> dict[str, tuple[object, ...]] | None:
    """What ClickHouse compares between replicas (MinimalisticChecksums with uncompressed hashes): per file
    of ``checksums.txt`` (format 4: LZ4 or uncompressed ClickHouse blocks) the uncompressed size and hash of a
    compressed file, the size and hash of any other.  None when the file cannot be read this way."""
    import lz4.block

    try:
        raw = (part_dir / "checksums.txt").read_bytes()
        header = b"checksums format version: 4\n"
        if not raw.startswith(header):
            return None
        pos, plain = len(header), b""
        while pos < len(raw):
            method = raw[pos + 16]
            size = int.from_bytes(raw[pos + 17:pos + 21], "little")
            usize = int.from_bytes(raw[pos + 21:pos + 25], "little")
            payload = raw[pos + 25:pos + 16 + size]
            plain += lz4.block.decompress(payload, uncompressed_size=usize) if method == 0x82 else payload
            pos += 16 + size
        count, p = _varuint(plain, 0)
        out: dict[str, tuple[object, ...]] = {}
        for _ in range(count):
            n, p = _varuint(plain, p)
            name = plain[p:p + n].decode()
            p += n
            fsize, p = _varuint(plain, p)
            fhash = plain[p:p + 16]
            p += 16
            compressed = plain[p] == 1
            p += 1
            if compressed:
                usize2, p = _varuint(plain, p)
                out[name] = ("compressed", usize2, plain[p:p + 16].hex())
                p += 16
            else:
                out[name] = ("plain", fsize, fhash.hex())
        return out
    except (OSError, IndexError, ValueError, lz4.block.LZ4BlockError):
        return None
