"""checkPartChecksumsAndCommit's reads (replicad.replication.checksum_compare.read_registrations) against a
real ZooKeeper: a replica's ``columns`` and ``checksums`` are compared only as a pair that existed together,
and the third read of the columns' version is made only when the checksums node was written after the
columns read."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import CorruptedDataError
from replicad.keeper.ops import Create, Set
from replicad.keeper.paths import TablePaths
from replicad.replication.checksum_compare import compare_with_replicas, read_registrations, recheck_absent
from replicad.storage.checksums import Checksum, Checksums, MinimalisticChecksums

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PART = "all_1_1_0"
COLUMNS = "columns format version: 1\n1 columns:\n`x` UInt64\n"
ALTERED = "columns format version: 1\n1 columns:\n`x` String\n"


def checksums(seed: int) -> Checksums:
    return Checksums({"x.bin": Checksum(100 + seed, bytes([seed]) * 16),
                      "count.txt": Checksum(1, b"\x07" * 16)})


async def register(keeper: Any, paths: TablePaths, replica: str, columns: str, cs: Checksums) -> None:
    rp = paths.replica(replica)
    await keeper.multi([Create(rp.part(PART), b""), Create(rp.part_columns(PART), columns.encode()),
                        Create(rp.part_checksums(PART), MinimalisticChecksums.from_checksums(cs).to_bytes())])


@pytest.fixture
async def table(keeper: Any) -> TablePaths:
    paths = TablePaths.create("/t", "me")
    for name in ("me", "a", "b"):
        await keeper.ensure_path(paths.replica(name).parts)
    return paths


async def test_a_pair_written_together_is_compared_without_a_third_read(
    keeper: Any, table: TablePaths
) -> None:
    await register(keeper, table, "a", COLUMNS, checksums(1))
    await register(keeper, table, "b", COLUMNS, checksums(2))  # differs from ours
    before = keeper.requests_total
    seen = await read_registrations(keeper, table, PART, ["a", "b", "me"], 0, include_self=False)
    assert keeper.requests_total - before == 4  # columns and checksums of a and b: no exists()
    with pytest.raises(CorruptedDataError):
        compare_with_replicas(seen, PART, COLUMNS, checksums(1))
    seen_a = await read_registrations(keeper, table, PART, ["a", "me"], 0, include_self=True)
    assert compare_with_replicas(seen_a, PART, COLUMNS, checksums(1)) == {table.me.part(PART)}


async def test_checksums_changed_after_the_columns_read_are_not_compared_with_them(
    keeper: Any, table: TablePaths
) -> None:
    """An ALTER landing between the two reads (both nodes set in one multi, as 18.16 does): the columns read
    are the old ones, the checksums the new ones, which differ from ours.  Compared, they would refuse a
    good part; the version read again shows the columns changed, and the pair is skipped."""
    await register(keeper, table, "a", COLUMNS, checksums(1))
    rp = table.replica("a")
    real_get = keeper.get
    altered: list[str] = []

    async def get(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == rp.part_checksums(PART) and not altered:
            altered.append(path)
            await keeper.multi([Set(rp.part_columns(PART), ALTERED.encode()),
                                Set(rp.part_checksums(PART),
                                    MinimalisticChecksums.from_checksums(checksums(9)).to_bytes())])
        return await real_get(path, *args, **kwargs)

    keeper.get = get
    try:
        before = keeper.requests_total
        seen = await read_registrations(keeper, table, PART, ["a"], 0, include_self=False)
    finally:
        keeper.get = real_get
    assert altered
    assert keeper.requests_total - before == 1 + 1 + 1 + 1  # columns, the ALTER's multi, checksums, exists()
    assert compare_with_replicas(seen, PART, COLUMNS, checksums(1)) == set()  # skipped, not refused


async def test_checksums_rewritten_alone_are_compared_after_the_version_read_again(
    keeper: Any, table: TablePaths
) -> None:
    """The checksums node written after the columns (columns unchanged): the third read finds the same columns
    version, so the pair is still compared, and a mismatch refuses the part."""
    await register(keeper, table, "a", COLUMNS, checksums(1))
    rp = table.replica("a")
    await keeper.set(rp.part_checksums(PART), MinimalisticChecksums.from_checksums(checksums(3)).to_bytes())
    before = keeper.requests_total
    seen = await read_registrations(keeper, table, PART, ["a"], 0, include_self=False)
    assert keeper.requests_total - before == 3
    with pytest.raises(CorruptedDataError):
        compare_with_replicas(seen, PART, COLUMNS, checksums(1))


async def test_a_failed_probe_rechecks_only_the_replicas_that_lacked_the_part(
    keeper: Any, table: TablePaths
) -> None:
    """The commit's probe for b failed: b registered the part meanwhile.  Only b (and ourselves) are read
    again, and b's registration is checked: a mismatch refuses the part, a match leaves only us absent."""
    await register(keeper, table, "a", COLUMNS, checksums(1))
    probed = {table.replica("b").part(PART), table.me.part(PART)}
    await register(keeper, table, "b", COLUMNS, checksums(5))
    before = keeper.requests_total
    with pytest.raises(CorruptedDataError):
        await recheck_absent(keeper, table, PART, probed, 0, COLUMNS, checksums(1))
    assert keeper.requests_total - before == 4  # columns of b and me; b's checksums, our part node
    await keeper.delete(table.replica("b").part(PART), recursive=True)
    await register(keeper, table, "b", COLUMNS, checksums(1))
    still_absent = await recheck_absent(keeper, table, PART, probed, 0, COLUMNS, checksums(1))
    assert still_absent == {table.me.part(PART)}
