"""A synthetic part directory for DataPartsExchange tests: the given files (any bytes), their
``checksums.txt`` and a ``columns.txt``.  Nothing reads the files as columns, so their contents are free."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from replicad.storage.checksums import Checksums, plain_checksum

ONE_COLUMN = b"columns format version: 1\n1 columns:\n`x` UInt8\n"


def write_part(part: Path, files: Mapping[str, bytes], columns_text: bytes = ONE_COLUMN) -> Checksums:
    """Make the directory ``part`` with ``files``, their checksums.txt and ``columns_text``; the checksums."""
    part.mkdir()
    for name, data in files.items():
        (part / name).write_bytes(data)
    cs = Checksums({n: plain_checksum(d) for n, d in files.items()})
    (part / "checksums.txt").write_bytes(cs.to_bytes())
    (part / "columns.txt").write_bytes(columns_text)
    return cs
