"""DataPartsExchange in zero-copy mode, the wire format (ClickHouse protocol version 6+): the request's
``remote_fs_metadata`` parameter, the answer's cookie of the same name, and the body that carries a part
instance's unique id and its files' metadata texts instead of their bytes::

    [v>=1 UInt64 size] [v>=2 String ttl] [v>=3 String type] [v>=5 UUID text] [v>=7 UInt64 projections = 0]
    String unique_id
    UInt64 n, n x (String name, UInt64 size, size bytes, 16-byte hash of the bytes)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from replicad.errors import ReplicadError
from replicad.model.cityhash import file_hash
from replicad.model.varint import encode_varuint
from replicad.storage.checksums import Checksums
from replicad.storage.part_transfer import body_header

ZERO_COPY_PROTOCOL_VERSION = 6
COOKIE = "remote_fs_metadata"
MAX_BODY = 64 << 20  # metadata texts only: a part with thousands of files stays far below
_U64 = struct.Struct("<Q")


class ZeroCopyFallback(ReplicadError):
    """The zero-copy fetch cannot go on (lock lost, object gone, bad answer): fetch the data instead."""

    code = 564  # ZERO_COPY_REPLICATION_ERROR
    retriable = True


def requested_types(query: Mapping[str, str]) -> set[str]:
    return {t.strip() for t in query.get(COOKIE, "").split(",") if t.strip()}


def send_version(query: Mapping[str, str]) -> int | None:
    """The protocol version of a zero-copy answer to this request, None when it does not ask for one."""
    text = query.get("client_protocol_version", "")
    if "s3" not in requested_types(query) or not text.isdigit() or int(text) < ZERO_COPY_PROTOCOL_VERSION:
        return None
    return min(int(text), 7)


def build_body(checksums: Checksums, version: int, unique_id: str, files: Mapping[str, bytes]) -> bytes:
    part_type = "Compact" if "data.bin" in checksums.files else "Wide"  # a Compact part: the peer refuses
    out = [body_header(checksums, version, part_type), _string(unique_id.encode()), _U64.pack(len(files))]
    for name in sorted(files):
        data = files[name]
        out += [_string(name.encode()), _U64.pack(len(data)), data, file_hash(data)]
    return b"".join(out)


def _string(b: bytes) -> bytes:
    return encode_varuint(len(b)) + b


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ZeroCopyFallback("truncated zero-copy answer")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def u64(self) -> int:
        value: int = _U64.unpack(self.take(8))[0]
        return value

    def string(self, limit: int = 1 << 20) -> bytes:
        n = shift = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift > 63:
                raise ZeroCopyFallback("bad VarUInt in zero-copy answer")
        if n > limit:
            raise ZeroCopyFallback(f"string of {n} bytes in zero-copy answer")
        return self.take(n)


def parse_body(body: bytes, version: int) -> tuple[str, dict[str, bytes]]:
    """(unique id, file name -> metadata text) of a zero-copy answer (hashes checked)."""
    r = _Reader(body)
    if version >= 1:
        r.u64()
    if version >= 2:
        r.string()
    if version >= 3:
        part_type = r.string().decode("utf-8", "replace")
        if part_type != "Wide":
            raise ZeroCopyFallback(f"part type {part_type!r} is not supported")
    if version >= 5:
        r.take(36)
    if version >= 7 and r.u64() != 0:
        raise ZeroCopyFallback("parts with projections are not supported")
    unique_id = r.string().decode("utf-8")
    files: dict[str, bytes] = {}
    for _ in range(r.u64()):
        name = r.string(4096).decode("utf-8")
        if not name or "/" in name or name in (".", "..") or name in files:
            raise ZeroCopyFallback(f"bad file name {name!r} in zero-copy answer")
        data = r.take(r.u64())
        if r.take(16) != file_hash(data):
            raise ZeroCopyFallback(f"hash mismatch for {name} in zero-copy answer")
        files[name] = data
    if r.pos != len(body):
        raise ZeroCopyFallback("trailing bytes in zero-copy answer")
    return unique_id, files
