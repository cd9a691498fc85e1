"""DataPartsExchange body codec: our v0 output equals a real 18.16 response; receive verifies everything."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.errors import CorruptedDataError, InsecurePathError, NotEnoughSpaceError
from replicad.model.cityhash import file_hash
from replicad.native._files import read_files
from replicad.storage import space_guard
from replicad.storage.checksums import Checksum, Checksums, MinimalisticChecksums
from replicad.storage.part import PartDirectory
from replicad.storage.part_receive import ReceivedPart, receive_part, receive_whole_body
from replicad.storage.part_transfer import (
    EMPTY_TTL_INFOS,
    SMALL_PART_BYTES,
    body_header,
    build_part_body,
    check_file_name,
    files_to_send,
    is_small_part,
    iter_part_body,
    iter_part_body_sync,
)
from tests.support.synthetic_part import write_part

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "ch18_part_basic"
PART = FIXTURE_DIR / "202611_1_1_0"
REAL_RESPONSE = (FIXTURE_DIR / "dpe_v0_response_202611_0_0_0.bin").read_bytes()
CHECKSUMS = Checksums.parse((PART / "checksums.txt").read_bytes())


def body_of(part: Path, cs: Checksums, version: int = 0, chunk: int = 1 << 20) -> bytes:
    return b"".join(iter_part_body_sync(part, cs, version, chunk))


def stream(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


#: every test here that receives a body does so through both drivers (tests run once per driver)
RECEIVER = ["stream"]


@pytest.fixture(autouse=True, params=["stream", "whole"])
def receiver(request: pytest.FixtureRequest) -> str:
    RECEIVER[0] = request.param
    return str(request.param)


async def recv(body: bytes, target: Path, version: int = 0,
               expected: Checksums | MinimalisticChecksums | None = None, **kw: Any) -> ReceivedPart:
    """``body`` received by the driver of the running test: streamed (receive_part) or whole in a worker
    thread (receive_whole_body, as the fetcher runs it)."""
    if RECEIVER[0] == "stream":
        return await receive_part(stream(body), target, version, expected, **kw)
    return await asyncio.to_thread(receive_whole_body, body, target, version, expected, **kw)


async def receive_from_bytes(
    body: bytes, target: Path, version: int, expected: Checksums | None = None
) -> ReceivedPart:
    return await recv(body, target, version, expected)


def varuint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes([*out, n])


def entry(name: bytes, data: bytes, digest: bytes | None = None) -> bytes:
    return varuint(len(name)) + name + struct.pack("<Q", len(data)) + data + (digest or file_hash(data))


def files_body(files: list[tuple[bytes, bytes]]) -> bytes:
    return struct.pack("<Q", len(files)) + b"".join(entry(n, d) for n, d in files)


def make_part(root: Path, extra: dict[str, bytes] | None = None) -> tuple[Path, Checksums]:
    """A synthetic part: small files plus a 300 KB one (bigger than one receive chunk path threshold)."""
    part = root / "all_1_1_0"
    files = {
        "count.txt": b"3",
        "big.mrk": random.Random(7).randbytes(300_000),
        "x.mrk": b"\x00" * 16,
        **(extra or {}),
    }
    return part, write_part(part, files)


async def test_v0_body_equals_real_18_16_response() -> None:
    assert files_to_send(CHECKSUMS)[:3] == ["checksums.txt", "columns.txt", "count.txt"]
    assert body_of(PART, CHECKSUMS) == REAL_RESPONSE
    assert body_of(PART, CHECKSUMS, chunk=100) == REAL_RESPONSE
    pieces = [p async for p in iter_part_body(PART, CHECKSUMS, 0, 1000)]
    assert b"".join(pieces) == REAL_RESPONSE and max(map(len, pieces)) <= 2000


async def test_receive_real_response(tmp_path: Path) -> None:
    got = await recv(REAL_RESPONSE, tmp_path / "tmp-fetch_202611_0_0_0", 0, CHECKSUMS)
    assert isinstance(got, ReceivedPart)
    assert got.checksums == CHECKSUMS and got.body_size == len(REAL_RESPONSE)
    assert got.extra_files == ("checksums.txt", "columns.txt")
    assert got.part_type == "Wide" and got.sum_files_size is None
    for p in PART.iterdir():
        assert (got.path / p.name).read_bytes() == p.read_bytes()
    assert len(list(got.path.iterdir())) == 20
    # what the commit takes instead of reading the files back: the same as reading them
    on_disk = PartDirectory.at(got.path)
    assert got.written == (on_disk.checksums, on_disk.columns_text, on_disk.rows, on_disk.bytes_on_disk)
    assert got.rows == int((PART / "count.txt").read_bytes())
    # the minimalistic value from ZooKeeper is accepted as the expectation as well
    zk = Checksums.parse((PART / "checksums.txt").read_bytes()).minimalistic()
    got2 = await recv(REAL_RESPONSE, tmp_path / "b", 0, zk, fsync=True)
    assert got2.checksums == CHECKSUMS


@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 7])
async def test_roundtrip_versions(tmp_path: Path, version: int) -> None:
    part, cs = make_part(tmp_path)
    body = body_of(part, cs, version, chunk=70_000)
    header = body_header(cs, version)
    assert body.startswith(header)
    if version >= 1:
        assert struct.unpack_from("<Q", body)[0] == 300_000 + 1 + 16
    if version >= 2:
        assert body[8] == 24 and body[9:33] == EMPTY_TTL_INFOS.encode()
    if version >= 3:
        assert body[33:38] == b"\x04Wide"
    got = await recv(body, tmp_path / "recv", version, cs)
    assert got.checksums == cs and got.part_type == "Wide"
    assert got.sum_files_size == (cs.total_size if version >= 1 else None)
    assert got.ttl_infos == (EMPTY_TTL_INFOS if version >= 2 else None)
    assert got.uuid == ("00000000-0000-0000-0000-000000000000" if version >= 5 else None)
    for name in files_to_send(cs):
        assert (got.path / name).read_bytes() == (part / name).read_bytes()


async def test_modern_extra_files_sent_and_accepted(tmp_path: Path) -> None:
    """Current ClickHouse's small unchecksummed files travel with the part (the sender adds those the part
    has; an 18.16 part has none, so its body is unchanged)."""
    part, cs = make_part(tmp_path)
    plain = body_of(part, cs)
    (part / "metadata_version.txt").write_bytes(b"0")
    body = body_of(part, cs)
    assert struct.unpack_from("<Q", body)[0] == struct.unpack_from("<Q", plain)[0] + 1
    got = await recv(body, tmp_path / "r", 0)
    assert "metadata_version.txt" in got.extra_files
    assert (got.path / "metadata_version.txt").read_bytes() == b"0"


def real_files() -> list[tuple[bytes, bytes]]:
    return [(n.encode(), (PART / n).read_bytes()) for n in files_to_send(CHECKSUMS)]


async def expect_failure(
    tmp_path: Path, body: bytes, exc: type[Exception], match: str, version: int = 0
) -> None:
    target = tmp_path / "tmp-fetch_x"
    with pytest.raises(exc, match=match):
        await recv(body, target, version, CHECKSUMS)
    assert not target.exists()  # nothing left behind


@pytest.mark.parametrize(
    "name",
    [
        *(b"../x", b"a/b", b"/etc/passwd", b"", b".", b"..", b"x\x00y", b"x" * 300),
        *(b"caf\xc3\xa9", b"a\\b", b"a b", b"\xff"),
    ],
)
async def test_bad_file_names(tmp_path: Path, name: bytes) -> None:
    body = files_body([(name, b"data")])
    await expect_failure(tmp_path, body, InsecurePathError, "Bad file name")
    assert not (tmp_path.parent / "x").exists()


async def test_hostile_bodies(tmp_path: Path) -> None:
    files = real_files()
    E = CorruptedDataError
    await expect_failure(tmp_path, REAL_RESPONSE + b"\x00", E, "Unexpected data after")
    bad_hash = REAL_RESPONSE[:-1] + bytes([REAL_RESPONSE[-1] ^ 1])
    await expect_failure(tmp_path, bad_hash, E, "Checksum mismatch for file tags.size0.mrk")
    # a file whose content differs from checksums.txt but is consistent with its own trailing hash
    swapped = [(n, b"4" if n == b"count.txt" else d) for n, d in files]
    await expect_failure(tmp_path, files_body(swapped), E, "Checksum mismatch for file count.txt")
    longer = [(n, b"33" if n == b"count.txt" else d) for n, d in files]
    await expect_failure(tmp_path, files_body(longer), E, "Unexpected size of file count.txt")
    missing = [(n, d) for n, d in files if n != b"id.bin"]
    await expect_failure(tmp_path, files_body(missing), E, "No file id.bin")
    no_columns = [(n, d) for n, d in files if n != b"columns.txt"]
    await expect_failure(tmp_path, files_body(no_columns), E, "No columns.txt")
    extra = [*files, (b"zzz.bin", b"x")]
    await expect_failure(tmp_path, files_body(extra), E, "Unexpected file zzz.bin")
    dup = [*files, files[-1]]
    await expect_failure(tmp_path, files_body(dup), E, "sent twice")
    huge = struct.pack("<Q", 1) + entry(b"a", b"")[:-16 - 8] + struct.pack("<Q", 1 << 50)
    await expect_failure(tmp_path, huge, E, "too large")
    await expect_failure(tmp_path, struct.pack("<Q", 1 << 40), E, "Too many files")
    await expect_failure(tmp_path, struct.pack("<Q", 5) + b"\x03ab", E, "Truncated")
    await expect_failure(tmp_path, struct.pack("<Q", 1) + REAL_RESPONSE, E, "declared for it", version=1)
    more = struct.pack("<Q", CHECKSUMS.total_size + 1) + REAL_RESPONSE
    await expect_failure(tmp_path, more, E, "Part size", version=1)
    v2 = struct.pack("<Q", CHECKSUMS.total_size) + b"\x03abc" + REAL_RESPONSE
    await expect_failure(tmp_path, v2, E, "Bad ttl infos", version=2)
    v7 = body_header(CHECKSUMS, 5) + struct.pack("<Q", 1) + REAL_RESPONSE
    await expect_failure(tmp_path, v7, E, "projections", version=7)
    v5 = body_header(CHECKSUMS, 3) + b"z" * 36 + REAL_RESPONSE
    await expect_failure(tmp_path, v5, E, "UUID", version=5)
    await expect_failure(tmp_path, REAL_RESPONSE, E, "protocol version", version=11)


async def test_expected_checksums_mismatch(tmp_path: Path) -> None:
    other = Checksums({**CHECKSUMS.files, "count.txt": Checksum(1, bytes(16))})
    with pytest.raises(CorruptedDataError, match=r"count\.txt"):
        await recv(REAL_RESPONSE, tmp_path / "t", 0, other)
    assert not (tmp_path / "t").exists()
    with pytest.raises(CorruptedDataError, match="don't match"):
        await recv(REAL_RESPONSE, tmp_path / "t", 0, other.minimalistic())


async def test_truncated_anywhere(tmp_path: Path) -> None:
    cuts = sorted({*random.Random(1).sample(range(1, len(REAL_RESPONSE)), 60), 1, 8, len(REAL_RESPONSE) - 1})
    for cut in cuts:
        target = tmp_path / f"t{cut}"
        with pytest.raises(CorruptedDataError):
            await recv(REAL_RESPONSE[:cut], target, 0)
        assert not target.exists()


async def test_truncated_big_file(tmp_path: Path) -> None:
    part, cs = make_part(tmp_path)
    body = body_of(part, cs)
    for cut in (200_000, len(body) - 17):
        with pytest.raises(CorruptedDataError, match="Truncated"):
            await recv(body[:cut], tmp_path / "t", 0, cs)
        assert not (tmp_path / "t").exists()


async def test_existing_target_is_not_touched(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "keep").write_bytes(b"1")
    with pytest.raises(FileExistsError):
        await recv(REAL_RESPONSE, tmp_path / "t", 0)
    assert (tmp_path / "t" / "keep").exists()


def damaged_copy(tmp_path: Path) -> tuple[Path, bytearray]:
    """A copy of PART (``tmp_path/p``) whose name.bin has one bit flipped; the damaged bytes."""
    part = tmp_path / "p"
    shutil.copytree(PART, part)
    data = bytearray((part / "name.bin").read_bytes())
    data[100] ^= 1
    (part / "name.bin").write_bytes(data)
    return part, data


def test_sender_detects_damaged_files(tmp_path: Path) -> None:
    part, data = damaged_copy(tmp_path)
    gen = iter_part_body_sync(part, CHECKSUMS, 0, 1 << 20)
    with pytest.raises(CorruptedDataError, match=r"Checksum mismatch for file name\.bin"):
        list(gen)
    (part / "name.bin").write_bytes(data[:-1])
    with pytest.raises(CorruptedDataError, match=r"Unexpected size of file name\.bin"):
        body_of(part, CHECKSUMS)
    os.remove(part / "id.bin")
    with pytest.raises(FileNotFoundError):
        body_of(part, CHECKSUMS)
    with pytest.raises(ValueError):
        body_header(CHECKSUMS, 8)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_whole_body_of_a_small_part(version: int) -> None:
    assert is_small_part(CHECKSUMS)
    assert build_part_body(PART, CHECKSUMS, version) == body_of(PART, CHECKSUMS, version, 1000)
    if version == 0:
        assert build_part_body(PART, CHECKSUMS, 0) == REAL_RESPONSE


def test_small_part_threshold() -> None:
    def sized(*sizes: int) -> Checksums:
        return Checksums({f"f{i}.bin": Checksum(n, b"\0" * 16) for i, n in enumerate(sizes)})

    assert is_small_part(sized()) and is_small_part(sized(SMALL_PART_BYTES))
    assert is_small_part(sized(SMALL_PART_BYTES - 10, 10))
    assert not is_small_part(sized(SMALL_PART_BYTES - 10, 11))


def test_whole_body_checks_files(tmp_path: Path) -> None:
    part, data = damaged_copy(tmp_path)
    with pytest.raises(CorruptedDataError, match=r"Checksum mismatch for file name\.bin in part p"):
        build_part_body(part, CHECKSUMS, 3)
    (part / "name.bin").write_bytes(data[:-1])
    with pytest.raises(CorruptedDataError, match=r"Unexpected size of file name\.bin in part p"):
        build_part_body(part, CHECKSUMS, 0)
    os.remove(part / "id.bin")
    with pytest.raises(FileNotFoundError):
        build_part_body(part, CHECKSUMS, 0)


def test_whole_body_sends_the_unchecksummed_files_a_part_has_and_refuses_odd_ones(tmp_path: Path) -> None:
    """The one-call read sends the small unchecksummed files current ClickHouse keeps where the part has them
    (as the streamed body does), and a name that is not a plain file is an error, not a body."""
    part, cs = make_part(tmp_path)
    (part / "metadata_version.txt").write_bytes(b"0")
    (part / "default_compression_codec.txt").write_bytes(b"CODEC(LZ4)")
    whole = build_part_body(part, cs, 3)
    assert whole == body_of(part, cs, 3, 1000)
    assert b"metadata_version.txt" in whole and b"default_compression_codec.txt" in whole
    os.remove(part / "metadata_version.txt")
    assert build_part_body(part, cs, 3) == body_of(part, cs, 3, 1000)
    os.remove(part / "x.mrk")
    os.mkdir(part / "x.mrk")  # a directory where checksums.txt lists a file
    with pytest.raises(IsADirectoryError):
        build_part_body(part, cs, 0)
    bad = Checksums({"../escape.bin": Checksum(1, b"\0" * 16)})
    with pytest.raises(InsecurePathError):
        build_part_body(part, bad, 0)


def test_read_files_reads_whole_files_in_one_call(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"hello")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "big").write_bytes(b"x" * 100_000)
    assert read_files(tmp_path, ["big", "a", "empty", "gone"], 1) == [b"x" * 100_000, b"hello", b"", None]
    with pytest.raises(FileNotFoundError) as e:
        read_files(tmp_path, ["a", "gone", "empty"], 1)  # only the last ``optional`` may be missing
    assert e.value.filename == f"{tmp_path}/gone"
    with pytest.raises(OSError, match="too large") as too_big:
        read_files(tmp_path, ["a", "big"], 0, 50_000)  # more than max_bytes in all
    assert too_big.value.filename == f"{tmp_path}/big"
    for bad in ("../a", "", ".", ".."):
        with pytest.raises(ValueError):
            read_files(tmp_path, [bad])
    with pytest.raises(NotADirectoryError):
        read_files(tmp_path / "a", ["x"])


def test_check_file_name() -> None:
    for good in ("id.bin", "n.null.mrk", "a%2E1.bin", "skp_idx_i.idx", "minmax_ctime.idx", "c-1+2.txt"):
        assert check_file_name(good) == good
    for bad in ("", ".", "..", "a/b", "a\x00", "x" * 256, "é", "a\n"):
        with pytest.raises(InsecurePathError):
            check_file_name(bad)


NAME = st.text(alphabet="abcxyz0129_.%-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..") and n not in ("checksums.txt", "columns.txt")
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(NAME, st.binary(max_size=5000), min_size=0, max_size=6), st.sampled_from([0, 1, 2, 3]))
def test_roundtrip_property(tmp_path: Path, files: dict[str, bytes], version: int) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    part = root / "part"
    cs = write_part(part, files, b"columns format version: 1\n0 columns:\n")
    body = body_of(part, cs, version, chunk=1000)
    got = asyncio.run(receive_from_bytes(body, root / "recv", version, cs))
    assert got.checksums == cs
    assert {p.name: p.read_bytes() for p in got.path.iterdir()} == {
        p.name: p.read_bytes() for p in part.iterdir()
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(NAME, st.binary(max_size=3000), min_size=0, max_size=8),
       st.sets(st.sampled_from(["metadata_version.txt", "txn_version.txt", "columns_substreams.txt"])),
       st.sampled_from([0, 1, 2, 3]))
def test_whole_body_equals_the_streamed_body(tmp_path: Path, files: dict[str, bytes], extras: set[str],
                                             version: int) -> None:
    part = Path(tempfile.mkdtemp(dir=tmp_path)) / "part"
    cs = write_part(part, files, b"columns format version: 1\n0 columns:\n")
    for name in extras:
        (part / name).write_bytes(name.encode())
    assert build_part_body(part, cs, version) == body_of(part, cs, version, chunk=700)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=len(REAL_RESPONSE) - 1), st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_is_rejected(tmp_path: Path, pos: int, xor: int) -> None:
    body = bytearray(REAL_RESPONSE)
    body[pos] ^= xor
    target = Path(tempfile.mkdtemp(dir=tmp_path)) / "t"
    # (a flipped size may also claim more than the disk has free: refused as such before it is read)
    with pytest.raises((CorruptedDataError, InsecurePathError, NotEnoughSpaceError)):
        asyncio.run(receive_from_bytes(bytes(body), target, 0))
    assert not target.exists()


async def test_declared_sizes_are_checked_against_the_limit_and_the_free_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a byte of a file is read: a part over ``max_part_bytes`` is refused, and one the disk cannot
    hold is refused as NOT_ENOUGH_SPACE (v1: the declared part size; v0: the declared file sizes)."""
    target = tmp_path / "tmp-fetch_x"
    with pytest.raises(CorruptedDataError, match="max_fetch_part_bytes"):
        await recv(REAL_RESPONSE, target, 0, CHECKSUMS, max_part_bytes=100)
    assert not target.exists()
    free = [0]
    monkeypatch.setattr(space_guard, "_free_bytes", lambda _d: free[0])
    monkeypatch.setattr(space_guard, "_RECENT_FREE", {})  # the real disk was read above
    # v0: checked at the first file and every SPACE_CHECK_STEP declared bytes; v1: the declared part size
    for version, body, room in ((0, REAL_RESPONSE, 0),
                                (1, body_header(CHECKSUMS, 1) + REAL_RESPONSE, CHECKSUMS.total_size - 1)):
        free[0] = room
        with pytest.raises(NotEnoughSpaceError, match="bytes free") as e:
            await recv(body, target, version, CHECKSUMS)
        assert e.value.code == 243 and e.value.retriable
        assert not target.exists()
    free[0] = CHECKSUMS.total_size
    got = await recv(REAL_RESPONSE, target, 0, CHECKSUMS)
    assert got.checksums.total_size == CHECKSUMS.total_size


async def test_a_recent_free_space_reading_serves_small_parts_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The free space read for one part serves the next ones of the same second while each needs a small share
    of it; a part needing more than that share reads it again (and is refused when it does not fit)."""
    reads: list[int] = []
    free = [CHECKSUMS.total_size * space_guard.FREE_SPACE_SHARE * 4]

    def fake_free(_d: Path) -> int:
        reads.append(free[0])
        return free[0]

    monkeypatch.setattr(space_guard, "_free_bytes", fake_free)
    monkeypatch.setattr(space_guard, "_RECENT_FREE", {})
    body = body_header(CHECKSUMS, 1) + REAL_RESPONSE
    for i in range(3):
        await recv(body, tmp_path / f"p{i}", 1, CHECKSUMS)
    assert len(reads) == 1
    free[0] = CHECKSUMS.total_size - 1  # the disk filled up; the recent reading is too small for a share
    monkeypatch.setattr(space_guard, "_RECENT_FREE",
                        {tmp_path: (time.monotonic(), CHECKSUMS.total_size * 100)})
    with pytest.raises(NotEnoughSpaceError):
        await recv(body, tmp_path / "big", 1, CHECKSUMS)
    assert len(reads) == 2 and not (tmp_path / "big").exists()
