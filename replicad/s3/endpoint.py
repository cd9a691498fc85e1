"""An S3 disk's endpoint URL, as ClickHouse takes it: ``http(s)://host[:port]/<bucket>/<key prefix>``
(path-style)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class S3Endpoint:
    url: str  # scheme://host[:port]
    bucket: str
    prefix: str  # "" or ending with "/"

    @classmethod
    def parse(cls, text: str) -> S3Endpoint:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"endpoint {text!r}: expected http(s)://host[:port]/bucket/prefix/")
        if parts.query or parts.fragment:
            raise ValueError(f"endpoint {text!r}: no query or fragment allowed")
        bucket, _, prefix = parts.path.lstrip("/").partition("/")
        if not 3 <= len(bucket) <= 63 or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
            raise ValueError(f"endpoint {text!r}: bad bucket name {bucket!r} (3-63 of a-z 0-9 . -)")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if "//" in prefix or prefix.startswith("/"):
            raise ValueError(f"endpoint {text!r}: empty path segment in the key prefix")
        return cls(f"{parts.scheme}://{parts.netloc}", bucket, prefix)

    def same_storage(self, other: S3Endpoint) -> bool:
        return (self.url, self.bucket, self.prefix) == (other.url, other.bucket, other.prefix)
