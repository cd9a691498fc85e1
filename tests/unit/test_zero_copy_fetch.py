"""The zero-copy DataPartsExchange body: build/parse round trip, strict refusals, request negotiation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.storage.checksums import Checksums
from replicad.storage.zero_copy_wire import ZeroCopyFallback, build_body, parse_body, send_version

CHECKSUMS = Checksums({})  # no files: the header carries only their total size

names = st.text(st.sampled_from("abcxyz_.0123"), min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..")
)
files = st.dictionaries(names, st.binary(max_size=200), max_size=6)


@given(files, st.sampled_from([6, 7]), st.text(st.sampled_from("abc/_"), min_size=1, max_size=40))
def test_round_trip(texts: dict[str, bytes], version: int, unique_id: str) -> None:
    body = build_body(CHECKSUMS, version, unique_id, texts)
    assert parse_body(body, version) == (unique_id, texts)


def test_refusals() -> None:
    body = build_body(CHECKSUMS, 7, "data/abc/x", {"checksums.txt": b"3\n0\t0\n0\n0\n"})
    with pytest.raises(ZeroCopyFallback):
        parse_body(body[:-1], 7)  # truncated
    with pytest.raises(ZeroCopyFallback):
        parse_body(body + b"x", 7)  # trailing bytes
    corrupted = bytearray(body)
    corrupted[-20] ^= 1  # inside the metadata text: its hash no longer matches
    with pytest.raises(ZeroCopyFallback):
        parse_body(bytes(corrupted), 7)


def test_negotiation() -> None:
    assert send_version({"client_protocol_version": "10", "remote_fs_metadata": "s3"}) == 7
    assert send_version({"client_protocol_version": "6", "remote_fs_metadata": "hdfs, s3"}) == 6
    assert send_version({"client_protocol_version": "5", "remote_fs_metadata": "s3"}) is None
    assert send_version({"client_protocol_version": "10", "remote_fs_metadata": "hdfs"}) is None
    assert send_version({"client_protocol_version": "10"}) is None
