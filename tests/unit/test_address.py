"""replicas/<r>/host and is_active texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import ZnodeFormatError
from replicad.model.address import ActiveMarker, ReplicaAddress

HOST_18_16 = (
    "host: ch1.local\nport: 9009\ntcp_port: 9000\ndatabase: default\ntable: test_replicated\nscheme: http\n"
)


def test_host_golden() -> None:
    a = ReplicaAddress.parse(HOST_18_16.encode())
    assert a == ReplicaAddress("ch1.local", 9009, 9000, "default", "test_replicated")
    assert a.to_text() == HOST_18_16
    assert a.base_url == "http://ch1.local:9009"
    assert ReplicaAddress("::1", 9009, 9000, "d", "t").base_url == "http://[::1]:9009"


def test_host_optional_and_modern_lines() -> None:
    no_scheme = "host: h\nport: 1\ntcp_port: 2\ndatabase: d\ntable: t\n"
    assert ReplicaAddress.parse(no_scheme).scheme == "http"
    modern = HOST_18_16 + "desired_part_metadata_format_version: 1\n"
    a = ReplicaAddress.parse(modern)
    assert a.desired_part_metadata_format_version == 1
    assert a.to_text() == modern
    future = HOST_18_16 + "future_field: x y\n"
    b = ReplicaAddress.parse(future)
    assert b.extra_lines == ("future_field: x y",)
    assert b.to_text() == future


def test_host_escaping() -> None:
    a = ReplicaAddress("h", 9009, 0, "my db", "t\tab'le", scheme="https")
    assert "table: t\\tab\\'le\n" in a.to_text()
    assert ReplicaAddress.parse(a.to_text()) == a


@pytest.mark.parametrize(
    "text",
    [
        "",
        "host: h\nport: x\ntcp_port: 2\ndatabase: d\ntable: t\n",
        "host: h\nport: 0\ntcp_port: 2\ndatabase: d\ntable: t\n",
        "host: h\nport: 1\ntcp_port: 2\ndatabase: d\n",
        HOST_18_16 + "garbage line\n",
    ],
)
def test_host_garbage(text: str) -> None:
    with pytest.raises(ZnodeFormatError):
        ReplicaAddress.parse(text)


def test_is_active() -> None:
    m = ActiveMarker.parse(b"pid: 3362, random: 18209704977984595537")
    assert (m.pid, m.random) == (3362, 18209704977984595537)
    assert (
        ActiveMarker.for_process(3362, 18209704977984595537).to_bytes()
        == b"pid: 3362, random: 18209704977984595537"
    )
    modern = ActiveMarker.parse("4b511731-411f-4080-ae74-b74cd5f77027")
    assert modern.pid is None and modern.to_text() == "4b511731-411f-4080-ae74-b74cd5f77027"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=15)


@settings(max_examples=200, deadline=None)
@given(_text, st.integers(1, 65535), st.integers(0, 65535), _text, _text, st.sampled_from(["http", "https"]))
def test_host_round_trip(host: str, port: int, tcp: int, db: str, table: str, scheme: str) -> None:
    a = ReplicaAddress(host, port, tcp, db, table, scheme)
    assert ReplicaAddress.parse(a.to_bytes()) == a
