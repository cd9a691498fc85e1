"""The independent checker's S3 half: judges a zero-copy table from outside, never through replicad's code.

It reads the bucket with boto3, every replica's local metadata files (ClickHouse's text format, parsed here)
and the zero-copy lock tree in ZooKeeper (kazoo), and verifies after the heal:

* ``s3_lost``     every object the metadata of an active part (on any replica) references is in the bucket,
                  with the size the metadata says; so is every object of an instance a lock leaf holds;
* ``s3_unlocked`` every active part has a persistent lock leaf ``<part>/<its id>/<replica>`` (no part is
                  visible without its lock: another replica's release could delete its objects);
* ``s3_lock``     every lock leaf refers to a part instance in that replica's metadata (same part name,
                  same unique id: the key of ``checksums.txt``'s first object), and no ephemeral (fetch)
                  leaf is left;
* ``s3_orphan``   once the orphan scan had time to run (its grace period and a few periods), no object in
                  the bucket is unreferenced by every replica's metadata.

States in flight (a fetch's metadata, a merge's upload, a release between its unlock and its delete) pass, so
the whole check is repeated until it finds nothing or ``wait_s`` runs out; the last snapshot's findings are
reported.  ``import replicad`` never happens here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.checker import Verdict

ZERO_COPY_ROOT = "/clickhouse/zero_copy"  # remote_fs_zero_copy_zookeeper_path's default (under the chroot)
EXCLUSIVE_LOCK = "part_exclusive_lock"
CHECKSUMS = "checksums.txt"
STABLE_SNAPSHOTS = 5  # identical findings this many times in a row end the wait
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "0": "\0", "b": "\b", "f": "\f", "r": "\r", "'": "'"}


# ---- the bucket --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    endpoint_url: str  # http://host:port
    name: str
    prefix: str  # the disk's key prefix inside the bucket ("chaos/")
    access_key: str
    secret_key: str

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1",
                            config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                                          read_timeout=30))

    def listing(self, client: Any) -> dict[str, tuple[int, float]]:
        """key -> (size, last modified as a UNIX time) of every object under the prefix."""
        out: dict[str, tuple[int, float]] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=self.prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = (int(o["Size"]), o["LastModified"].timestamp())
        return out


# ---- local metadata files ----------------------------------------------------------------------------------


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append(_UNESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_metadata(data: bytes, prefix: str) -> list[tuple[str, int]]:
    """(full object key, size) of each object one metadata file lists.  Version 1 keys are absolute, 2-4
    relative to the disk's prefix, 5 full keys.  ValueError for text of another shape."""
    lines = data.decode("utf-8").split("\n")
    version = int(lines[0])
    if not 1 <= version <= 5:
        raise ValueError(f"metadata version {version}")
    count, total = (int(x) for x in lines[1].split("\t"))
    objects = []
    for line in lines[2:2 + count]:
        size, key = line.split("\t", 1)
        key = _unescape(key)
        objects.append((key if version in (1, 5) else prefix + key, int(size)))
    if len(objects) != count or sum(s for _k, s in objects) != total:
        raise ValueError(f"metadata lists {len(objects)} objects of {sum(s for _k, s in objects)} bytes, "
                         f"its header says {count} of {total}")
    return objects


@dataclass
class PartMeta:
    """One part directory of a replica's S3 metadata: its files' objects and its unique id."""

    files: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def unique_id(self) -> str:
        objs = self.files.get(CHECKSUMS) or []
        return objs[0][0] if objs else ""

    def keys(self) -> dict[str, int]:
        return {k: s for objs in self.files.values() for k, s in objs}


def read_parts(metadata_root: Path, prefix: str) -> dict[str, PartMeta]:
    """Every directory under a table's metadata root (parts, and in-flight ``tmp-*`` / ``*.tmp`` ones)."""
    out: dict[str, PartMeta] = {}
    if not metadata_root.is_dir():
        return out
    for d in sorted(metadata_root.iterdir()):
        if not d.is_dir():
            continue
        meta = PartMeta()
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue  # removed meanwhile
        for name in names:
            try:
                meta.files[name] = parse_metadata((d / name).read_bytes(), prefix)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, UnicodeDecodeError) as e:
                meta.errors.append(f"{name}: {e}")
        out[d.name] = meta
    return out


def all_referenced(disk_root: Path, prefix: str) -> set[str]:
    """Every key any metadata file on a replica's disk references (all tables, in-flight directories too)."""
    keys: set[str] = set()
    for dirpath, _dirs, files in os.walk(disk_root):
        for f in files:
            try:
                keys |= {k for k, _s in parse_metadata((Path(dirpath) / f).read_bytes(), prefix)}
            except (OSError, ValueError, UnicodeDecodeError):
                continue
    return keys


# ---- the lock tree -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    part: str
    id_node: str
    replica: str
    ephemeral: bool


def lock_tree(zk: Any, base: str) -> tuple[list[Leaf], list[tuple[str, str]]]:
    """(every lock leaf, the id nodes without a leaf) under ``base`` = ``<root>/zero_copy_s3/<shared id>``."""
    from kazoo.exceptions import NoNodeError

    def kids(path: str) -> list[str]:
        try:
            return sorted(zk.get_children(path))
        except NoNodeError:
            return []

    leaves, empty = [], []
    for part in kids(base):
        for id_node in kids(f"{base}/{part}"):
            if id_node == EXCLUSIVE_LOCK:
                continue
            holders = kids(f"{base}/{part}/{id_node}")
            if not holders:
                empty.append((part, id_node))
            for replica in holders:
                stat = zk.exists(f"{base}/{part}/{id_node}/{replica}")
                if stat is not None:
                    leaves.append(Leaf(part, id_node, replica, bool(stat.ephemeralOwner)))
    return leaves, empty


def id_node_of(unique_id: str) -> str:
    return unique_id.replace("/", "_")


# ---- the check ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Replica:
    name: str
    metadata_root: Path  # <data_path>/disks/<disk>/store/<db>/<table>
    disk_root: Path  # <data_path>/disks/<disk>
    served: Callable[[], set[str]]  # the replica's active parts (its HTTP parts listing)


@dataclass
class Snapshot:
    findings: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    objects: int = 0
    leaves: int = 0
    young_orphans: int = 0  # unreferenced objects the orphan scan may not have judged yet


def snapshot(bucket: Bucket, client: Any, zk: Any, base: str, replicas: Sequence[S3Replica],
             orphan_age_s: float, now: float | None = None) -> Snapshot:
    """One pass of every S3 check.  Orphans younger than ``orphan_age_s`` are not counted yet."""
    snap = Snapshot()
    before = bucket.listing(client)  # orphans: listed before the metadata is read
    served = {r.name: r.served() for r in replicas}
    parts = {r.name: read_parts(r.metadata_root, bucket.prefix) for r in replicas}
    referenced: set[str] = set()
    for r in replicas:
        referenced |= all_referenced(r.disk_root, bucket.prefix)
    leaves, empty = lock_tree(zk, base) if base else ([], [])
    after = bucket.listing(client)  # losses: listed after the metadata is read
    snap.objects, snap.leaves = len(after), len(leaves)
    held = {(lf.part, lf.id_node, lf.replica) for lf in leaves if not lf.ephemeral}

    def missing(keys: dict[str, int]) -> list[str]:
        return sorted(k for k, s in keys.items() if k not in after or after[k][0] != s)

    for r in replicas:
        for part in sorted(served[r.name]):
            meta = parts[r.name].get(part)
            if meta is None:
                snap.findings.append(("s3_lost", f"{r.name}: active part {part} has no S3 metadata"))
                continue
            for err in meta.errors:
                snap.findings.append(("s3_lost", f"{r.name}: {part}: unreadable metadata {err}"))
            gone = missing(meta.keys())
            if gone:
                snap.findings.append(("s3_lost", f"{r.name}: active part {part} lost {len(gone)} of "
                                                 f"{len(meta.keys())} objects, e.g. {gone[0]}"))
            if not meta.unique_id:
                snap.findings.append(("s3_lost", f"{r.name}: active part {part} has no {CHECKSUMS} object"))
            elif (part, id_node_of(meta.unique_id), r.name) not in held:
                snap.findings.append(("s3_unlocked", f"{r.name}: active part {part} (instance "
                                                     f"{meta.unique_id}) has no persistent lock leaf"))
    names = {r.name for r in replicas}
    for lf in leaves:
        where = f"lock {lf.part}/{lf.id_node}/{lf.replica}"
        if lf.ephemeral:
            snap.findings.append(("s3_lock", f"{where} is an ephemeral (fetch) leaf left after the heal"))
            continue
        if lf.replica not in names:
            snap.findings.append(("s3_lock", f"{where}: no such replica in the set"))
            continue
        meta = parts[lf.replica].get(lf.part)
        if meta is None:
            snap.findings.append(("s3_lock", f"{where}: {lf.replica} has no part {lf.part} on its S3 disk"))
            continue
        if id_node_of(meta.unique_id) != lf.id_node:
            snap.findings.append(("s3_lock", f"{where}: {lf.replica}'s part {lf.part} is another instance "
                                             f"({meta.unique_id or 'none'})"))
            continue
        gone = missing(meta.keys())
        if gone:  # a held instance (outdated parts included) keeps every object
            snap.findings.append(("s3_lost", f"{where}: the instance {lf.replica} holds lost {len(gone)} "
                                             f"objects, e.g. {gone[0]}"))
    for part, id_node in empty:
        snap.notes.append(f"id node {part}/{id_node} has no lock leaf (its objects are kept)")
    now = time.time() if now is None else now
    unreferenced = [k for k in before if k not in referenced and k in after]
    orphans = sorted(k for k in unreferenced if now - before[k][1] >= orphan_age_s)
    snap.young_orphans = len(unreferenced) - len(orphans)
    if orphans:
        oldest = max(now - before[k][1] for k in orphans)
        snap.findings.append(("s3_orphan", f"{len(orphans)} objects no replica's metadata references (the "
                                           f"oldest {oldest:.0f} s old), e.g. {orphans[0]}"))
    return snap


def zero_copy_base(zk: Any, chroot: str, table_zk_path: str) -> str:
    """``<chroot><root>/zero_copy_s3/<table_shared_id>``, or "" when the table has no shared id yet."""
    from kazoo.exceptions import NoNodeError

    try:
        shared = bytes(zk.get(chroot + table_zk_path + "/table_shared_id")[0]).decode()
    except NoNodeError:
        return ""
    return f"{chroot}{ZERO_COPY_ROOT}/zero_copy_s3/{shared}"


def check(v: Verdict, bucket: Bucket, zk_hosts: str, chroot: str, table_zk_path: str,
          replicas: Sequence[S3Replica], *, wait_s: float, orphan_age_s: float) -> Snapshot:
    """Repeats :func:`snapshot` until it finds nothing (and no unreferenced object is left for the orphan scan
    to judge) or ``wait_s`` passed; adds the last findings to ``v``."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=zk_hosts, timeout=10)
    zk.start(30)
    client = bucket.client()
    deadline = time.monotonic() + wait_s
    try:
        base = zero_copy_base(zk, chroot, table_zk_path)
        previous: list[tuple[str, str]] | None = None
        same = 0
        while True:
            snap = snapshot(bucket, client, zk, base, replicas, orphan_age_s)
            same = same + 1 if snap.findings == previous else 0
            previous = snap.findings
            if not snap.young_orphans and (not snap.findings or same >= STABLE_SNAPSHOTS):
                break  # clean, or the same findings again and again (lost objects do not come back)
            if time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        zk.stop()
        zk.close()
    for kind, detail in snap.findings[:40]:
        v.add(kind, detail)
    if len(snap.findings) > 40:
        v.add(snap.findings[40][0], f"... and {len(snap.findings) - 40} more S3 findings")
    return snap
