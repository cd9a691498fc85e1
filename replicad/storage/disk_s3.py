"""An S3 disk: a part's files as S3 objects, each described by a local metadata file in ClickHouse's format.

Layout (as ClickHouse's object-storage disks): ``<data_path>/disks/<disk>/store/<db>/<table>/<part>/<file>``
holds one :class:`~replicad.model.remote_metadata.RemoteMetadata` text per file of the part; the objects are
``<key prefix><aaa>/<29 letters>`` in the bucket.  The part directory under ``data/`` keeps a local copy of
the bytes (a cache every reader uses); it can be rebuilt from the bucket through the metadata at any time
(:meth:`S3Disk.materialize_sync`), which is also how a zero-copy fetch gets the data.

Keys: all objects of one part instance share their first 29 characters after the prefix (3 letters, ``/``,
25 letters: the instance *stem*) and differ in the last 4 letters (the file's index).  A key therefore still
matches ClickHouse's ``[a-z]{3}/[a-z]{29}`` template, and the orphan scan can tell from a key alone which
part instance (= which zero-copy lock id, the key of ``checksums.txt``) it belongs to.
"""

from __future__ import annotations

import os
import secrets
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replicad.errors import CorruptedDataError
from replicad.model.remote_metadata import RemoteMetadata, StoredObject
from replicad.s3 import S3Client
from replicad.storage.part import CHECKSUMS_FILE, fsync_dir, write_file

if TYPE_CHECKING:
    from replicad.config_sections import StorageConfig

DISK_TYPE = "s3"
STEM_LEN = 29  # "abc/" + 25 letters
INDEX_LEN = 4  # 26**4 files per part instance
_LETTERS = string.ascii_lowercase


def new_stem() -> str:
    letters = "".join(secrets.choice(_LETTERS) for _ in range(28))
    return f"{letters[:3]}/{letters[3:]}"


def object_name(stem: str, index: int) -> str:
    if not 0 <= index < 26 ** INDEX_LEN:
        raise ValueError(f"too many files in one part ({index})")
    tail = ""
    for _ in range(INDEX_LEN):
        index, r = divmod(index, 26)
        tail = _LETTERS[r] + tail
    return stem + tail


def stem_of(relative_key: str) -> str | None:
    """The instance stem of a relative key written by :func:`object_name`, None for another shape."""
    if len(relative_key) != STEM_LEN + INDEX_LEN or relative_key[3] != "/":
        return None
    body = relative_key[:3] + relative_key[4:]
    if not all(c in _LETTERS for c in body):
        return None
    return relative_key[:STEM_LEN]


@dataclass(frozen=True)
class RemotePartFiles:
    """The metadata files of one part: file name -> metadata."""

    files: dict[str, RemoteMetadata]

    def keys(self) -> list[str]:
        return [o.key for m in self.files.values() for o in m.objects]


class S3Disk:
    """One configured ``type: s3`` disk."""

    disk_type = DISK_TYPE

    def __init__(self, name: str, client: S3Client, metadata_path: Path) -> None:
        self.name = name
        self.client = client
        self.prefix = client.endpoint.prefix
        self.metadata_path = metadata_path  # <data_path>/disks/<name>

    def full_key(self, relative: str) -> str:
        return self.prefix + relative

    def relative_key(self, full: str) -> str | None:
        return full[len(self.prefix):] if full.startswith(self.prefix) else None

    def stem_of_id_node(self, id_node: str) -> str | None:
        """The instance stem of a zero-copy lock id node ('/' -> '_' of a full key) written by this disk."""
        mangled = self.prefix.replace("/", "_")
        if not id_node.startswith(mangled):
            return None
        rest = id_node[len(mangled):]
        if len(rest) != STEM_LEN + INDEX_LEN or rest[3] != "_":
            return None
        return stem_of(rest[:3] + "/" + rest[4:])

    def table_metadata_path(self, database: str, table: str) -> Path:
        return self.metadata_path / "store" / database / table

    # ---------------------------------------------------------------------------- writing (worker thread)

    def offload_sync(self, part_dir: Path, metadata_dir: Path) -> str:
        """Upload every file of ``part_dir`` as a fresh object and write ``metadata_dir`` (replaced if it
        exists).  Returns the part instance's unique id (the full key of checksums.txt's object).  On
        failure the objects uploaded so far are deleted and nothing is left in ``metadata_dir``."""
        names = sorted(e.name for e in os.scandir(part_dir) if e.is_file())
        if CHECKSUMS_FILE not in names:
            raise CorruptedDataError(f"part {part_dir.name}: no {CHECKSUMS_FILE} to offload")
        stem = new_stem()
        uploaded: list[str] = []
        tmp = metadata_dir.with_name(metadata_dir.name + ".tmp")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for i, name in enumerate(names):
                rel = object_name(stem, i)
                size = self.client.put_file_sync(self.full_key(rel), part_dir / name)
                uploaded.append(self.full_key(rel))
                meta = RemoteMetadata((StoredObject(rel, size),))
                write_file(tmp / name, meta.format(), fsync=True)
            fsync_dir(tmp)
            shutil.rmtree(metadata_dir, ignore_errors=True)
            os.rename(tmp, metadata_dir)
            fsync_dir(metadata_dir.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if uploaded:
                try:
                    self.client.delete_sync(uploaded)
                except Exception:  # a leak the orphan scan finds; the upload error matters more
                    pass
            raise
        return self.full_key(object_name(stem, names.index(CHECKSUMS_FILE)))

    def write_metadata_sync(self, metadata_dir: Path, files: dict[str, bytes]) -> RemotePartFiles:
        """Write received metadata texts (parsed strictly first; ref counts reset to 0)."""
        parsed = {n: RemoteMetadata.parse(raw, self.prefix).with_ref_count(0) for n, raw in files.items()}
        shutil.rmtree(metadata_dir, ignore_errors=True)
        metadata_dir.mkdir(parents=True)
        for name, meta in parsed.items():
            write_file(metadata_dir / name, meta.format(), fsync=True)
        fsync_dir(metadata_dir)
        return RemotePartFiles(parsed)

    # ---------------------------------------------------------------------------- reading (worker thread)

    def read_metadata_sync(self, metadata_dir: Path) -> RemotePartFiles:
        files: dict[str, RemoteMetadata] = {}
        for e in sorted(os.scandir(metadata_dir), key=lambda e: e.name):
            if e.is_file():
                with open(e.path, "rb") as f:
                    files[e.name] = RemoteMetadata.parse(f.read(), self.prefix)
        return RemotePartFiles(files)

    def unique_id_sync(self, metadata_dir: Path) -> str:
        """The full key of checksums.txt's first object ("" if it has none), as ClickHouse's getUniqueId."""
        with open(metadata_dir / CHECKSUMS_FILE, "rb") as f:
            meta = RemoteMetadata.parse(f.read(), self.prefix)
        return self.full_key(meta.objects[0].key) if meta.objects else ""

    def serialized_metadata_sync(self, metadata_dir: Path) -> dict[str, bytes]:
        """Every metadata file's text with ref_count 0 (what a zero-copy send carries)."""
        files = self.read_metadata_sync(metadata_dir).files
        return {n: m.with_ref_count(0).format() for n, m in files.items()}

    def materialize_sync(self, metadata_dir: Path, dest_dir: Path) -> int:
        """Rebuild a part's files in ``dest_dir`` from the bucket (NoSuchKeyError if an object is gone).
        Returns the bytes read."""
        remote = self.read_metadata_sync(metadata_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        total = 0
        for name, meta in remote.files.items():
            with open(dest_dir / name, "wb") as f:
                for o in meta.objects:
                    n = self.client.download_into_sync(self.full_key(o.key), f)
                    if n != o.size:
                        raise CorruptedDataError(
                            f"object {o.key} of {dest_dir.name}/{name} has {n} bytes, metadata says {o.size}"
                        )
                    total += n
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(dest_dir)
        return total

    def check_unique_id_sync(self, unique_id: str) -> bool:
        """ClickHouse's checkUniqueId: the id lies under this disk's prefix and its object exists."""
        return unique_id.startswith(self.prefix) and self.client.head_sync(unique_id) is not None

    def remove_objects_sync(self, metadata_dir: Path) -> int:
        """Delete the objects a part's metadata lists (the caller decided it may); returns the count."""
        keys = [self.full_key(k) for k in self.read_metadata_sync(metadata_dir).keys()]
        return self.client.delete_sync(keys) if keys else 0


def build_disks(storage: StorageConfig, data_path: Path) -> dict[str, S3Disk]:
    """The config's ``storage.disks`` as disks (clients are created, nothing is contacted yet)."""
    from replicad.s3 import S3Endpoint

    out: dict[str, S3Disk] = {}
    for name, d in sorted(storage.disks.items()):
        client = S3Client(
            S3Endpoint.parse(d.endpoint),
            d.access_key_id,
            d.secret_access_key,
            region=d.region,
            max_attempts=d.max_attempts,
            multipart_threshold=d.multipart_threshold,
            multipart_chunksize=d.multipart_chunksize,
        )
        out[name] = S3Disk(name, client, data_path / "disks" / name)
    return out
