"""DataPartsExchange in zero-copy mode (ClickHouse protocol version 6+, ``remote_fs_metadata`` param/cookie).

The fetcher adds ``remote_fs_metadata=s3`` to its request; a sender whose part lives on a zero-copy S3 disk
answers with the cookie ``remote_fs_metadata=s3`` and a body that carries, after the usual header fields, the
part instance's unique id and then each file's *metadata text* (ref count 0) instead of its bytes::

    [v>=1 UInt64 size] [v>=2 String ttl] [v>=3 String type] [v>=5 UUID text] [v>=7 UInt64 projections = 0]
    String unique_id
    UInt64 n, n x (String name, UInt64 size, size bytes, 16-byte hash of the bytes)

The receiver checks the id (under its disk's prefix, object present), takes the ephemeral lock leaf under
the existing id node (never creating it: an instance whose last holder let go cannot be locked again),
writes the metadata, reads the part's bytes from the bucket through it and verifies them against
checksums.txt.  Any failure there is a :class:`ZeroCopyFallback`: the fetch is repeated as a full one.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from replicad.errors import CorruptedDataError
from replicad.replication.zero_copy import RemoteParts
from replicad.replication.zero_copy_locks import ZeroCopyLockLostError
from replicad.s3 import S3Error
from replicad.storage.part import PartDirectory
from replicad.storage.part_receive import ReceivedPart
from replicad.storage.zero_copy_wire import (
    COOKIE,
    MAX_BODY,
    ZERO_COPY_PROTOCOL_VERSION,
    ZeroCopyFallback,
    build_body,
    parse_body,
    requested_types,
    send_version,
)

__all__ = ["COOKIE", "MAX_BODY", "ZERO_COPY_PROTOCOL_VERSION", "ZeroCopyFallback", "build_body", "parse_body",
           "receive", "requested_types", "send_version"]

async def receive(
    remote: RemoteParts, part_name: str, body: bytes, version: int, tmp_dir: Path
) -> ReceivedPart:
    """Lock, write the metadata, read the part from the bucket into ``tmp_dir`` and verify it."""
    locks = remote.locks
    if locks is None:
        raise ZeroCopyFallback("zero-copy answer without zero-copy replication")
    unique_id, files = parse_body(body, version)
    if "checksums.txt" not in files or "columns.txt" not in files:
        raise ZeroCopyFallback("zero-copy answer without checksums.txt / columns.txt")
    disk = remote.disk
    meta_dir = remote.fetch_metadata_dir(part_name)
    held = False
    try:
        if not await asyncio.to_thread(disk.check_unique_id_sync, unique_id):
            raise ZeroCopyFallback(f"part {part_name}: instance {unique_id} is not on this disk (or is gone)")
        held = await locks.lock_temporary(part_name, unique_id)
        remote.fetched_metadata(part_name, unique_id, held)
        await asyncio.to_thread(disk.write_metadata_sync, meta_dir, files)
        if await asyncio.to_thread(disk.unique_id_sync, meta_dir) != unique_id:
            raise ZeroCopyFallback(f"part {part_name}: unique id does not match checksums.txt's object")
        await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
        size = await asyncio.to_thread(disk.materialize_sync, meta_dir, tmp_dir)
        directory = PartDirectory.at(tmp_dir)
        await asyncio.to_thread(directory.verify)
        checksums, columns_text = directory.checksums, directory.columns_text
    except BaseException as e:
        remote.instances.pop(part_name, None)
        if held:
            await asyncio.shield(locks.release_temporary(part_name, unique_id))
        await asyncio.to_thread(shutil.rmtree, meta_dir, True)
        await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
        if isinstance(e, (ZeroCopyLockLostError, S3Error, CorruptedDataError, UnicodeDecodeError)):
            raise ZeroCopyFallback(f"zero-copy fetch of {part_name}: {e}") from e
        raise
    return ReceivedPart(tmp_dir, checksums, {}, body_size=len(body), columns_text=columns_text,
                        sum_files_size=size)
