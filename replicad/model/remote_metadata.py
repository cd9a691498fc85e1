"""ClickHouse's local metadata file of an object-storage disk (DiskObjectStorageMetadata).

One such small text file stands for each file of a part on an S3 disk and lists the objects holding its
bytes::

    <version>\\n
    <object count>\\t<total size>\\n
    <size>\\t<key>\\n            (once per object; the key TSV-escaped)
    <ref count>\\n
    <read only 0|1>\\n        (version >= 3)
    <inline data>\\n          (version >= 4, TSV-escaped; written only when not empty)

Versions 1 (keys with the disk prefix), 2 (keys relative to the prefix), 3 (+ read-only flag, what ClickHouse
writes today), 4 (+ inline data) and 5 (full object keys) are read; 3 is written (4 when there is inline
data, 5 when asked for full keys).  ``parse(format(m)) == m`` for every record this module builds.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.errors import CorruptedDataError

VERSION_ABSOLUTE_PATHS = 1
VERSION_RELATIVE_PATHS = 2
VERSION_READ_ONLY_FLAG = 3
VERSION_INLINE_DATA = 4
VERSION_FULL_OBJECT_KEY = 5

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "0": "\0", "b": "\b", "f": "\f", "r": "\r", "'": "'"}


class UnknownMetadataFormatError(CorruptedDataError):
    code = 91  # UNKNOWN_FORMAT


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(c, c) for c in text)


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] not in _UNESCAPES:
                raise UnknownMetadataFormatError(f"bad escape in metadata file: {text[:80]!r}")
            out.append(_UNESCAPES[text[i + 1]])
            i += 2
            continue
        if c in "\t\n":
            raise UnknownMetadataFormatError(f"unescaped separator in metadata field: {text[:80]!r}")
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class StoredObject:
    """One object of a file: its key (relative to the disk's key prefix, or full with version 5) and size."""

    key: str
    size: int


@dataclass(frozen=True)
class RemoteMetadata:
    """The contents of one metadata file."""

    objects: tuple[StoredObject, ...] = ()
    ref_count: int = 0
    read_only: bool = False
    inline_data: str = ""
    version: int = VERSION_READ_ONLY_FLAG

    def __post_init__(self) -> None:  # the version this record is written with (3, 4 with inline data, or 5)
        v = max(self.version, VERSION_READ_ONLY_FLAG)
        if v == VERSION_INLINE_DATA and not self.inline_data:
            v = VERSION_READ_ONLY_FLAG
        if self.inline_data and v < VERSION_INLINE_DATA:
            v = VERSION_INLINE_DATA
        object.__setattr__(self, "version", v)

    @property
    def total_size(self) -> int:
        return sum(o.size for o in self.objects)

    def with_ref_count(self, ref_count: int) -> RemoteMetadata:
        return RemoteMetadata(self.objects, ref_count, self.read_only, self.inline_data, self.version)

    # ------------------------------------------------------------------------------------------ codec

    def format(self) -> bytes:
        version = self.version
        lines = [str(version), f"{len(self.objects)}\t{self.total_size}"]
        for o in self.objects:
            if o.size < 0:
                raise ValueError(f"negative object size {o.size}")
            lines.append(f"{o.size}\t{_escape(o.key)}")
        lines.append(str(self.ref_count))
        lines.append("1" if self.read_only else "0")
        if version >= VERSION_INLINE_DATA and self.inline_data:
            lines.append(_escape(self.inline_data))
        return ("\n".join(lines) + "\n").encode("utf-8")

    @classmethod
    def parse(cls, data: bytes, key_prefix: str = "") -> RemoteMetadata:
        """Strict parse; ``key_prefix``: the disk's prefix, stripped from version-1 (absolute) keys."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UnknownMetadataFormatError("metadata file is not UTF-8") from None
        if not text.endswith("\n"):
            raise UnknownMetadataFormatError(f"metadata file does not end with a newline: {text[:80]!r}")
        lines = text[:-1].split("\n")
        pos = 0

        def take() -> str:
            nonlocal pos
            if pos >= len(lines):
                raise UnknownMetadataFormatError(f"metadata file is truncated: {text[:80]!r}")
            pos += 1
            return lines[pos - 1]

        version = _uint(take())
        if not VERSION_ABSOLUTE_PATHS <= version <= VERSION_FULL_OBJECT_KEY:
            raise UnknownMetadataFormatError(f"unknown metadata file version {version}")
        head = take().split("\t")
        if len(head) != 2:
            raise UnknownMetadataFormatError(f"bad object count line {lines[1]!r}")
        count, total = _uint(head[0]), _uint(head[1])
        objects: list[StoredObject] = []
        for _ in range(count):
            row = take().split("\t")
            if len(row) != 2:
                raise UnknownMetadataFormatError(f"bad object line {row!r}")
            key = _unescape(row[1])
            if version == VERSION_ABSOLUTE_PATHS:
                if not key.startswith(key_prefix):
                    raise UnknownMetadataFormatError(f"key {key!r} is not under the prefix {key_prefix!r}")
                key = key[len(key_prefix):]
            if not key:
                raise UnknownMetadataFormatError("empty object key")
            objects.append(StoredObject(key, _uint(row[0])))
        if sum(o.size for o in objects) != total:
            raise UnknownMetadataFormatError(f"object sizes do not add up to {total}")
        ref_count = _uint(take())
        read_only = False
        if version >= VERSION_READ_ONLY_FLAG:
            flag = take()
            if flag not in ("0", "1"):
                raise UnknownMetadataFormatError(f"bad read-only flag {flag!r}")
            read_only = flag == "1"
        inline = ""
        if version >= VERSION_INLINE_DATA and pos < len(lines):
            inline = _unescape(take())
        if pos != len(lines):
            raise UnknownMetadataFormatError(f"trailing lines in metadata file: {lines[pos:][:3]!r}")
        return cls(tuple(objects), ref_count, read_only, inline, version)


def _uint(text: str) -> int:
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise UnknownMetadataFormatError(f"not an unsigned integer: {text[:40]!r}")
    return int(text)
