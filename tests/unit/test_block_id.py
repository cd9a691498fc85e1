"""Deduplication block ids (CLICKHOUSE_FACTS §4.1)."""

from __future__ import annotations

import struct

import pytest

from replicad.errors import BadInputError
from replicad.model.block_id import (
    block_id_from_checksums,
    block_id_from_token,
    block_token,
    partition_of_block_id,
)
from replicad.model.siphash import SipHash

H1 = bytes(range(16))
H2 = bytes(range(16, 32))


def test_checksums_hash_layout() -> None:
    files = [
        ("id.bin", 2, H1),
        ("count.txt", 1, b"\0" * 16),
        ("ctime.bin", 8, H2),
        ("id.mrk", 16, b"\1" * 16),
    ]
    expected = SipHash().update(
        struct.pack("<Q", 9) + b"ctime.bin" + struct.pack("<Q", 8) + H2
        + struct.pack("<Q", 6) + b"id.bin" + struct.pack("<Q", 2) + H1
    )  # fmt: skip
    w0, w1 = expected.get128()
    assert block_id_from_checksums("202611", files) == f"202611_{w0}_{w1}"
    assert block_id_from_checksums("202611", list(reversed(files))) == f"202611_{w0}_{w1}"


def test_name_order_is_bytewise() -> None:
    a = block_id_from_checksums("all", [("B.bin", 1, H1), ("a.bin", 1, H2)])
    b = block_id_from_checksums("all", [("a.bin", 1, H2), ("B.bin", 1, H1)])
    assert a == b
    manual = SipHash()
    for name, h in ((b"B.bin", H1), (b"a.bin", H2)):  # 'B' (0x42) sorts before 'a' (0x61)
        manual.update_string(name).update_u64(1).update(h)
    assert a == "all_{}_{}".format(*manual.get128())


def test_bad_hash_length() -> None:
    with pytest.raises(ValueError):
        block_id_from_checksums("all", [("x.bin", 1, b"short")])


def test_token() -> None:
    w0, w1 = SipHash().update(b"tok_0").get128()
    assert block_id_from_token("202611", block_token("tok", 0)) == f"202611_{w0}_{w1}"
    assert block_id_from_token("all", b"raw") == "all_{}_{}".format(*SipHash().update(b"raw").get128())
    with pytest.raises(BadInputError):
        block_id_from_token("all", "")


def test_partition_of_block_id() -> None:
    assert partition_of_block_id("202611_9379380059107496000_15770403400277312188") == "202611"
    assert partition_of_block_id("202611-5_1_2") == "202611-5"
    with pytest.raises(BadInputError):
        partition_of_block_id("all_replace_from_ABC")
