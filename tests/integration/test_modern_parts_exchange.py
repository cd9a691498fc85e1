"""A Compact part (as current ClickHouse writes it, made by chdb) over DataPartsExchange: a modern client
(protocol v3+) is told its type and gets it; replicad receives a Compact body and reads the same rows chdb
answers; a client of protocol v0 (ClickHouse 18.16, which reads Wide parts only) is refused with an
explanation, and the part is not reported broken for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from replicad.server.interserver import Endpoint, InterserverServer, PartToSend
from replicad.storage.checksums import Checksums
from replicad.storage.part_receive import receive_part
from replicad.storage.part_transfer import RECEIVE_MAX_PROTOCOL_VERSION
from tests.integration.test_modern_parts_chdb import chs, create, only_part, q, read_part
from tests.support.part_rows import ALL_TYPES, make_rows

__all__ = ["chs"]  # the chdb session fixture
pytestmark = pytest.mark.integration
ZK_REPLICA = "/clickhouse/tables/01/m/replicas/r9"


async def test_a_compact_part_goes_over_dataparts_exchange(chs: Any, tmp_path: Path) -> None:
    table, tsv = make_rows(ALL_TYPES, 1000, 7)
    t = create(chs, ALL_TYPES, "index_granularity = 100")
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    part = only_part(chs, t)
    assert (part / "data.bin").exists()
    checksums = Checksums.parse((part / "checksums.txt").read_bytes())
    broken: list[str] = []
    server = InterserverServer("127.0.0.1", 0)
    lookup = {part.name: PartToSend(part, checksums)}.get
    server.register(ZK_REPLICA, Endpoint(lookup, on_broken_part=broken.append))
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/"
        params = {"endpoint": f"DataPartsExchange:{ZK_REPLICA}", "part": part.name, "compress": "false"}
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            modern = {**params, "client_protocol_version": str(RECEIVE_MAX_PROTOCOL_VERSION)}
            async with s.post(url, params=modern) as resp:
                assert resp.status == 200
                version = int(resp.cookies["server_protocol_version"].value)
                received = await receive_part(resp.content, tmp_path / "tmp-fetch_x", version, checksums)
            async with s.post(url, params=params) as resp:  # protocol 0, as ClickHouse 18.16 asks
                text = await resp.text()
                assert resp.status == 500 and "Compact" in text and "Wide parts only" in text, text
    finally:
        await server.stop()
    assert received.part_type == "Compact"
    got = read_part(received.path, ALL_TYPES)
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name
    assert q(chs, f"SELECT count() FROM {t}").strip() == "1000"
    assert broken == []
