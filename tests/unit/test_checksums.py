"""checksums.txt v2/v3/v4, minimalistic v5, part header, comparisons — against files written by 18.16."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import CorruptedDataError
from replicad.model.cityhash import file_hash
from replicad.native import _checksums
from replicad.storage.checksums import (
    Checksum,
    Checksums,
    MinimalisticChecksums,
    PartHeader,
    plain_checksum,
)
from replicad.storage.compression import compress_block, decompress_all, iter_blocks

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BASIC_DIR = FIXTURES / "ch18_part_basic"
BASIC = BASIC_DIR / "202611_1_1_0"
ZSTD = FIXTURES / "ch18_part_zstd" / "all_1_1_0"
COLUMNS_TEXT = (BASIC / "columns.txt").read_text()


def recompute(part: Path, cs: Checksums) -> Checksums:
    files = {}
    for name, c in cs.files.items():
        data = (part / name).read_bytes()
        if c.is_compressed:
            plain = decompress_all(data, name)
            files[name] = Checksum(len(data), file_hash(data), True, len(plain), file_hash(plain))
        else:
            files[name] = plain_checksum(data)
    return Checksums(files)


@pytest.mark.parametrize("part", [BASIC, ZSTD], ids=["basic", "zstd"])
def test_golden_parse_reserialize_and_recompute(part: Path) -> None:
    raw = (part / "checksums.txt").read_bytes()
    cs = Checksums.parse(raw)
    on_disk = {p.name for p in part.iterdir()} - {"checksums.txt", "columns.txt"}
    assert set(cs.files) == on_disk
    assert cs.to_bytes() == raw  # byte-identical to what 18.16 wrote
    again = recompute(part, cs)
    assert again == cs
    cs.check_equal(again, have_uncompressed=True)
    assert all(c.is_compressed == name.endswith(".bin") for name, c in cs.files.items())
    assert cs.total_size == sum((part / n).stat().st_size for n in cs.files)


def test_golden_values() -> None:
    cs = Checksums.parse((BASIC / "checksums.txt").read_bytes())
    assert cs.files["count.txt"] == Checksum(1, bytes.fromhex("77b7950445b8f9bd2bab46cbff137bdb"))  # "3"
    assert list(cs.files) == sorted(cs.files)
    # minimalistic value 18.16 stored in ZooKeeper for the identical replicated part
    zk = (BASIC_DIR / "zk_parts_202611_0_0_0_checksums.bin").read_bytes()
    assert cs.minimalistic_text() == zk
    parsed = MinimalisticChecksums.parse(zk)
    assert parsed == cs.minimalistic() and parsed.full is None
    assert (parsed.num_compressed_files, parsed.num_uncompressed_files) == (7, 11)
    parsed.check_equal(cs, check_uncompressed_hash_in_compressed_files=True)
    parsed.check_equal(cs, check_uncompressed_hash_in_compressed_files=False)
    # block_id of the INSERT that produced it (blocks/ znode and log entry written by 18.16)
    lo, hi = cs.data_only_hash()
    assert f"202611_{lo}_{hi}" == "202611_1990357432951509220_9732454676020422111"
    assert len(cs.total_checksum_hex()) == 32 and cs.total_checksum_hex().isupper()


def test_full_text_in_zookeeper_and_old_versions() -> None:
    cs = Checksums.parse((BASIC / "checksums.txt").read_bytes())
    for text in (cs.to_bytes(), cs.to_v2_text(), b"checksums format version: 3\n" + cs.v3_body()):
        assert Checksums.parse(text) == cs
        m = MinimalisticChecksums.parse(text)
        assert m == cs.minimalistic() and m.full == cs
        m.check_equal(MinimalisticChecksums.parse(text), True)
    v2 = cs.to_v2_text().decode()
    assert v2.startswith("checksums format version: 2\n18 files:\ncount.txt\n\tsize: 1\n\thash: ")
    assert "\tcompressed: 1\n\tuncompressed size: 12\n\tuncompressed hash: " in v2


def test_v4_blocks_of_64k() -> None:
    files = {f"c{i:05d}_{'x' * 40}.bin": Checksum(i, bytes(16), True, i, bytes(16)) for i in range(2000)}
    cs = Checksums(files)
    raw = cs.to_bytes()
    blocks = [len(p) for _, p in iter_blocks(raw[len(b"checksums format version: 4\n") :])]
    assert len(blocks) > 1 and blocks[:-1] == [65536] * (len(blocks) - 1)
    assert Checksums.parse(raw) == cs


def test_part_header() -> None:
    cs = Checksums.parse((BASIC / "checksums.txt").read_bytes())
    h = PartHeader.from_parts(COLUMNS_TEXT, cs)
    raw = h.to_bytes()
    assert raw.startswith(b"part header format version: 1\n") and len(raw) == 30 + 16 + 2 + 48
    assert PartHeader.parse(raw) == h
    with_id = PartHeader(h.columns_hash, h.checksums, "all_1_2")
    assert PartHeader.parse(with_id.to_bytes()) == with_id
    with pytest.raises(CorruptedDataError):
        PartHeader.parse(raw + b"x")


def test_check_equal_errors() -> None:
    a = Checksums({"a.bin": Checksum(5, b"1" * 16, True, 7, b"2" * 16), "b.mrk": Checksum(16, b"3" * 16)})
    with pytest.raises(CorruptedDataError, match="Unexpected file c"):
        a.check_equal(Checksums({**a.files, "c": Checksum(1, bytes(16))}))
    with pytest.raises(CorruptedDataError, match=r"No file b\.mrk"):
        a.check_equal(Checksums({"a.bin": a.files["a.bin"]}))
    other = Checksums({**a.files, "a.bin": Checksum(6, b"1" * 16, True, 7, b"2" * 16)})
    with pytest.raises(CorruptedDataError, match=r"Unexpected size of file a\.bin"):
        a.check_equal(other)
    a.check_equal(other, have_uncompressed=True)  # compared by uncompressed size/hash only
    with pytest.raises(CorruptedDataError, match=r"Checksum mismatch for file a\.bin"):
        a.check_equal(Checksums({**a.files, "a.bin": Checksum(5, b"9" * 16, True, 7, b"2" * 16)}))
    with pytest.raises(CorruptedDataError, match=r"uncompressed file a\.bin"):
        a.check_equal(Checksums({**a.files, "a.bin": Checksum(5, b"1" * 16, True, 7, b"8" * 16)}), True)
    ma = a.minimalistic()
    with pytest.raises(CorruptedDataError, match="uncompressed hash of compressed files"):
        ma.check_equal(Checksums({**a.files, "a.bin": Checksum(5, b"1" * 16, True, 7, b"8" * 16)}), True)
    with pytest.raises(CorruptedDataError, match="total hash of all files"):
        ma.check_equal(Checksums({**a.files, "a.bin": Checksum(5, b"9" * 16, True, 7, b"2" * 16)}), False)
    ma.check_equal(other, False)  # the size is not part of the totals
    with pytest.raises(CorruptedDataError, match="hash of uncompressed files"):
        ma.check_equal(Checksums({**a.files, "b.mrk": Checksum(16, b"4" * 16)}), True)
    with pytest.raises(CorruptedDataError, match="Different number of files"):
        ma.check_equal(Checksums({"a.bin": a.files["a.bin"]}), True)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"checksums format version: 1\n",
        b"checksums format version: 6\n",
        b"checksums format version: x\n",
        b"checksum format version: 4\n",
        b"checksums format version: 3\n\x01\x03abc",
        b"checksums format version: 3\n\x01\x00" + bytes(18),
        b"checksums format version: 3\n\x01\x01a\x01" + bytes(16) + b"\x02",
        b"checksums format version: 3\n\x00junk",
        b"checksums format version: 2\n1 files:\na\n\tsize: 1\n\thash: 1 2\n\tcompressed: 0",
        b"checksums format version: 2\n1 files:\na\n\tsize: -1\n\thash: 1 2\n\tcompressed: 0\n",
        b"checksums format version: 2\n1 files:\na\n\tsize: 1\n\thash: 1 99999999999999999999\n"
        b"\tcompressed: 0\n",
        b"checksums format version: 4\n" + compress_block(b"\x00")[:-1],
        b"checksums format version: 4\n" + compress_block(b"\x00junk"),
        b"checksums format version: 4\n" + compress_block(b"\x00") + b"more",
    ],
)
def test_parse_rejects(bad: bytes) -> None:
    with pytest.raises(CorruptedDataError):
        Checksums.parse(bad)


def test_minimalistic_rejects() -> None:
    good = Checksums({"a": Checksum(1, bytes(16))}).minimalistic_text()
    MinimalisticChecksums.parse(good)
    for bad in (good + b"\x00", good[:-1], good.replace(b"5\n", b"6\n"), b"checksums format version: 1\n"):
        with pytest.raises(CorruptedDataError):
            MinimalisticChecksums.parse(bad)


def test_checksum_validation() -> None:
    with pytest.raises(ValueError):
        Checksum(1, b"short")
    with pytest.raises(ValueError):
        Checksum(-1, bytes(16))


NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\t\n"), min_size=1, max_size=30)
HASH = st.binary(min_size=16, max_size=16)
SIZE = st.integers(min_value=0, max_value=(1 << 64) - 1)
ENTRY = st.one_of(
    st.builds(Checksum, SIZE, HASH),
    st.builds(Checksum, SIZE, HASH, st.just(True), SIZE, HASH),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(NAMES, ENTRY, max_size=20))
def test_roundtrip_all_versions(files: dict[str, Checksum]) -> None:
    cs = Checksums(files)
    assert Checksums.parse(cs.to_bytes()) == cs
    assert Checksums.parse(cs.to_v2_text()) == cs
    assert Checksums.parse(b"checksums format version: 3\n" + cs.v3_body()) == cs
    assert cs.v3_body() == cs.v3_body_python()  # the native encoder (native/checksums.c)
    m = MinimalisticChecksums.parse(cs.minimalistic_text())
    assert m == cs.minimalistic()
    m.check_equal(cs, True)
    assert m.num_compressed_files + m.num_uncompressed_files == len(files)
    lo, hi = struct.unpack("<QQ", m.hash_of_all_files)
    assert cs.total_checksum() == (lo, hi)


def test_native_v3_body_rejects_what_the_format_cannot_hold() -> None:
    """A size past UInt64, a hash of another length, a non-dict: errors, not a truncated body."""
    with pytest.raises(ValueError, match="UInt64"):
        _checksums.v3_body({"a": SimpleNamespace(file_size=-1, file_hash=bytes(16), is_compressed=False)})
    with pytest.raises(ValueError, match="16 bytes"):
        _checksums.v3_body({"a": SimpleNamespace(file_size=1, file_hash=bytes(15), is_compressed=False)})
    with pytest.raises(ValueError, match="16 bytes"):
        _checksums.v3_body({"a": SimpleNamespace(file_size=1, file_hash=bytes(16), is_compressed=True,
                                                 uncompressed_size=3, uncompressed_hash=b"")})
    with pytest.raises(TypeError):
        _checksums.v3_body([("a", Checksum(1, bytes(16)))])
