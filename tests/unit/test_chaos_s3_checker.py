"""The chaos checker's S3 half judging hand-made states: metadata files on disk, a fake bucket listing and a
fake lock tree (no processes)."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.chaos.s3_checker import Bucket, S3Replica, parse_metadata, snapshot

PREFIX = "replicad/"
BASE = "/zc/zero_copy_s3/uuid"


def meta(*objects: tuple[str, int], version: int = 3) -> bytes:
    lines = [str(version), f"{len(objects)}\t{sum(s for _k, s in objects)}"]
    lines += [f"{s}\t{k}" for k, s in objects]
    return ("\n".join([*lines, "0", "0"]) + "\n").encode()


def test_parse_metadata_versions_and_escapes() -> None:
    assert parse_metadata(meta(("abc/def", 7)), PREFIX) == [("replicad/abc/def", 7)]
    assert parse_metadata(meta(("replicad/abc/def", 7), version=5), PREFIX) == [("replicad/abc/def", 7)]
    assert parse_metadata(b"2\n1\t3\n3\ta\\tb\n1\n", PREFIX) == [("replicad/a\tb", 3)]
    with pytest.raises(ValueError):
        parse_metadata(b"3\n2\t10\n3\tabc\n0\n0\n", PREFIX)  # the header says two objects
    with pytest.raises(ValueError):
        parse_metadata(b"9\n0\t0\n0\n0\n", PREFIX)


class FakeClient:
    def __init__(self, objects: dict[str, tuple[int, float]]) -> None:
        self.objects = objects

    def get_paginator(self, _name: str) -> Any:
        objects = self.objects

        class Pages:
            def paginate(self, **_kw: Any) -> list[dict[str, Any]]:
                return [{"Contents": [
                    {"Key": k, "Size": s, "LastModified": datetime.datetime.fromtimestamp(t, datetime.UTC)}
                    for k, (s, t) in sorted(objects.items())]}]

        return Pages()


class FakeZk:
    def __init__(self, leaves: list[tuple[str, str, str]], ephemeral: set[str] = frozenset()) -> None:
        self.nodes: dict[str, set[str]] = {}
        self.ephemeral = ephemeral
        for part, id_node, replica in leaves:
            self.nodes.setdefault(BASE, set()).add(part)
            self.nodes.setdefault(f"{BASE}/{part}", set()).add(id_node)
            self.nodes.setdefault(f"{BASE}/{part}/{id_node}", set()).add(replica)
            self.nodes.setdefault(f"{BASE}/{part}/{id_node}/{replica}", set())

    def get_children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        if path not in self.nodes:
            raise NoNodeError(path)
        return sorted(self.nodes[path])

    def exists(self, path: str) -> Any:
        if path not in self.nodes:
            return None
        return SimpleNamespace(ephemeralOwner=1 if path in self.ephemeral else 0)


def replica(tmp: Path, name: str, parts: dict[str, dict[str, list[tuple[str, int]]]],
            served: set[str]) -> S3Replica:
    disk = tmp / name / "disks" / "s3main"
    root = disk / "store" / "db" / "t"
    for part, files in parts.items():
        (root / part).mkdir(parents=True)
        for fname, objs in files.items():
            (root / part / fname).write_bytes(meta(*objs))
    return S3Replica(name, root, disk, lambda: set(served))


NOW = 2_000_000_000.0
PART = {"checksums.txt": [("abc/stemaaaa", 10)], "id.bin": [("abc/stemaaab", 20)]}
UID = "replicad_abc_stemaaaa"
OBJECTS = {"replicad/abc/stemaaaa": (10, NOW - 500), "replicad/abc/stemaaab": (20, NOW - 500)}


def judge(tmp: Path, objects: dict[str, tuple[int, float]], leaves: list[tuple[str, str, str]],
          ephemeral: set[str] = frozenset()) -> Any:
    r1 = replica(tmp, "r1", {"0_1_1_0": PART}, {"0_1_1_0"})
    r2 = replica(tmp, "r2", {"0_1_1_0": PART}, {"0_1_1_0"})
    bucket = Bucket("http://unused", "b", PREFIX, "k", "s")
    return snapshot(bucket, FakeClient(objects), FakeZk(leaves, ephemeral), BASE, [r1, r2], orphan_age_s=60,
                    now=NOW)


def test_a_consistent_state_passes(tmp_path: Path) -> None:
    snap = judge(tmp_path, OBJECTS, [("0_1_1_0", UID, "r1"), ("0_1_1_0", UID, "r2")])
    assert snap.findings == [] and snap.young_orphans == 0


def test_a_lost_object_is_reported(tmp_path: Path) -> None:
    objects = {k: v for k, v in OBJECTS.items() if not k.endswith("aaab")}
    snap = judge(tmp_path, objects, [("0_1_1_0", UID, "r1"), ("0_1_1_0", UID, "r2")])
    kinds = [k for k, _d in snap.findings]
    assert kinds.count("s3_lost") == 4  # both active parts, both held instances
    assert "lost 1 of 2 objects" in snap.findings[0][1]


def test_a_part_without_its_lock_and_a_lock_without_its_part(tmp_path: Path) -> None:
    snap = judge(tmp_path, OBJECTS, [("0_1_1_0", UID, "r1"), ("0_2_2_0", "replicad_xyz_other", "r2"),
                                     ("0_1_1_0", "replicad_abc_otherid", "r2")])
    got = sorted(snap.findings)
    assert [k for k, _ in got] == ["s3_lock", "s3_lock", "s3_unlocked"]
    assert "r2 has no part 0_2_2_0" in got[0][1] + got[1][1]
    assert "is another instance" in got[0][1] + got[1][1]
    assert got[2][1].startswith("r2: active part 0_1_1_0")


def test_an_ephemeral_leaf_left_is_reported(tmp_path: Path) -> None:
    leaves = [("0_1_1_0", UID, "r1"), ("0_1_1_0", UID, "r2"), ("0_1_1_0", UID, "r3")]
    snap = judge(tmp_path, OBJECTS, leaves, ephemeral={f"{BASE}/0_1_1_0/{UID}/r3"})
    assert [k for k, _ in snap.findings] == ["s3_lock"] and "ephemeral" in snap.findings[0][1]


def test_orphans_once_old_enough(tmp_path: Path) -> None:
    objects = {**OBJECTS, "replicad/zzz/oldaaaa": (5, NOW - 300), "replicad/zzz/newaaaa": (5, NOW - 10)}
    snap = judge(tmp_path, objects, [("0_1_1_0", UID, "r1"), ("0_1_1_0", UID, "r2")])
    assert [k for k, _ in snap.findings] == ["s3_orphan"]
    assert "1 objects" in snap.findings[0][1] and "replicad/zzz/oldaaaa" in snap.findings[0][1]
    assert snap.young_orphans == 1
