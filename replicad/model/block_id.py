"""Deduplication block ids: the names under ``<zk>/blocks/``.

``<partition_id>_<w0>_<w1>`` with ``(w0, w1)`` = ClickHouse's SipHash ``get128()`` words, in decimal.

* From the part data (18.16 and modern without a token; ``getZeroLevelPartBlockID``): the hash runs over
  the checksums entries whose name ends in ``.bin``, in byte order of the names: UInt64 length of the name,
  the name, UInt64 uncompressed size, the 16-byte uncompressed hash.
* From ``insert_deduplication_token`` (18.16 has no such setting; modern ClickHouse): the hash runs over the
  raw token bytes alone.  Modern servers make the token distinct per block of one INSERT by appending
  ``_<ordinal>`` (0, 1, …) before hashing (ReplicatedMergeTreeSink / InsertBlockIDGenerator, 22.x–25.x);
  ``block_token`` builds that string.  26.x's reworked deduplication may hash differently (unverified);
  an id made here only has to be stable for replicad's own retries, since ClickHouse never recomputes ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from replicad.errors import BadInputError
from replicad.model.siphash import SipHash


def _format(partition_id: str, h: SipHash) -> str:
    w0, w1 = h.get128()
    return f"{partition_id}_{w0}_{w1}"


def block_id_from_checksums(partition_id: str, files: Iterable[tuple[str, int, bytes]]) -> str:
    """``files``: ``(name, uncompressed_size, uncompressed_hash)`` for the part's checksums entries (any
    order; entries not ending in ``.bin`` are ignored; the hash is the 16-byte low-word-first value)."""
    h = SipHash()
    for name, uncompressed_size, uncompressed_hash in sorted(
        (f for f in files if f[0].endswith(".bin")), key=lambda f: f[0].encode()
    ):
        if len(uncompressed_hash) != 16:
            raise ValueError(f"uncompressed hash of {name} must be 16 bytes, got {len(uncompressed_hash)}")
        h.update_string(name.encode())
        h.update_u64(uncompressed_size)
        h.update(uncompressed_hash)
    return _format(partition_id, h)


def block_token(insert_deduplication_token: str, ordinal: int) -> str:
    """The per-block token of the ``ordinal``-th block (part) of one INSERT."""
    return f"{insert_deduplication_token}_{ordinal}"


def block_id_from_token(partition_id: str, token: str | bytes) -> str:
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if not raw:
        raise BadInputError("insert_deduplication_token must not be empty")
    return _format(partition_id, SipHash().update(raw))


def partition_of_block_id(block_id: str) -> str:
    """The partition id prefix of a block id (everything before the last two ``_`` fields)."""
    head, sep1, w1 = block_id.rpartition("_")
    pid, sep2, w0 = head.rpartition("_")
    if not (sep1 and sep2 and w0.isdigit() and w1.isdigit()):
        raise BadInputError(f"not a block id: {block_id!r}")
    return pid
