"""ClickHouse's object-storage metadata file: golden texts, strict parse, round trip; the S3 disk's keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.model.remote_metadata import RemoteMetadata, StoredObject, UnknownMetadataFormatError
from replicad.storage.disk_s3 import new_stem, object_name, stem_of

GOLDEN_V3 = b"3\n1\t1234\n1234\tabc/defghijklmnopqrstuvwxyzabcdef\n0\n0\n"


def test_golden_v3() -> None:
    m = RemoteMetadata.parse(GOLDEN_V3)
    assert m.objects == (StoredObject("abc/defghijklmnopqrstuvwxyzabcdef", 1234),)
    assert (m.ref_count, m.read_only, m.version) == (0, False, 3)
    assert m.format() == GOLDEN_V3


def test_older_and_newer_versions() -> None:
    v1 = RemoteMetadata.parse(b"1\n1\t5\n5\tdata/abc/x\n2\n", "data/")
    assert v1.objects[0].key == "abc/x" and v1.ref_count == 2 and v1.version == 3
    v2 = RemoteMetadata.parse(b"2\n2\t7\n3\tk1\n4\tk2\n0\n")
    assert [o.key for o in v2.objects] == ["k1", "k2"] and v2.total_size == 7
    v4 = RemoteMetadata.parse(b"4\n0\t0\n0\n1\nhello\\tworld\n")
    assert v4.inline_data == "hello\tworld" and v4.read_only
    v5 = RemoteMetadata.parse(b"5\n1\t3\n3\tbucket-prefix/full/key\n0\n0\n")
    assert v5.version == 5 and v5.format() == b"5\n1\t3\n3\tbucket-prefix/full/key\n0\n0\n"
    empty = RemoteMetadata.parse(b"3\n0\t0\n0\n0\n")
    assert empty.objects == () and empty.format() == b"3\n0\t0\n0\n0\n"


@pytest.mark.parametrize("bad", [
    b"6\n0\t0\n0\n0\n",  # unknown version
    b"3\n1\t5\n4\tk\n0\n0\n",  # sizes do not add up
    b"3\n1\t5\n5\tk\n0\n",  # read-only flag missing
    b"3\n1\t5\n5\tk\n0\n0",  # no final newline
    b"3\n1\t5\n5\tk\n0\n0\nextra\n",  # trailing line
    b"3\n1\t5\n5\t\n0\n0\n",  # empty key
    b"3\n1\t-5\n-5\tk\n0\n0\n",
    b"1\n1\t5\n5\tother/k\n0\n",  # absolute key outside the prefix
    b"3\n1\t5\n5\tk\\q\n0\n0\n",  # bad escape
])
def test_strict(bad: bytes) -> None:
    with pytest.raises(UnknownMetadataFormatError):
        RemoteMetadata.parse(bad, "data/")


_keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)
records = st.builds(
    RemoteMetadata,
    st.lists(st.builds(StoredObject, _keys, st.integers(0, 1 << 40)), max_size=5).map(tuple),
    st.integers(0, 1000),
    st.booleans(),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20),
    st.sampled_from([3, 4, 5]),
)


@given(records)
def test_round_trip(m: RemoteMetadata) -> None:
    assert RemoteMetadata.parse(m.format()) == m
    assert RemoteMetadata.parse(m.format()).format() == m.format()


def test_object_keys_share_the_instance_stem() -> None:
    stem = new_stem()
    keys = [object_name(stem, i) for i in (0, 1, 25, 26, 26**4 - 1)]
    assert len(set(keys)) == 5
    for k in keys:
        assert len(k) == 33 and k[3] == "/" and stem_of(k) == stem  # ClickHouse's [a-z]{3}/[a-z]{29}
    assert stem_of("abc/def") is None and stem_of("ABC/" + "a" * 29) is None
    with pytest.raises(ValueError):
        object_name(stem, 26**4)
