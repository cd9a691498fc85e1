"""The HTTP API against a fake TableService/Catalog (the seam in replicad.service)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from replicad.config import build_config
from replicad.errors import QuorumError, TooManyPartsError
from replicad.server import output_formats
from replicad.server.api import ApiServer, ApiState, create_app
from replicad.server.metrics import Metrics
from replicad.server.routing import InsertRoute, SelectRoute, StatementRoute, route
from replicad.service import StatementKind
from replicad.tasks import FunctionTask
from tests.support.fake_engine import FakeCatalog, FakeTable, serve_fake_api

ROWS = b"2020-01-02\t2020-01-02 03:04:05\t5\tclick\n2020-01-03\t2020-01-03 00:00:00\t6\tview\n"
ERROR_RE = re.compile(r"^Code: (\d+)\. DB::Exception: (.+)\n$", re.S)


class Api:
    def __init__(self, client: TestClient[Any, Any], state: ApiState, table: FakeTable,
                 catalog: FakeCatalog) -> None:
        self.client, self.state, self.table, self.catalog = client, state, table, catalog

    async def post(self, query: str | None, data: bytes = b"",
                   **params: str) -> tuple[int, dict[str, str], bytes]:
        if query is not None:
            params["query"] = query
        async with self.client.post("/", params=params, data=data) as r:
            return r.status, dict(r.headers), await r.read()

    async def get(self, path: str, **params: str) -> tuple[int, dict[str, str], bytes]:
        async with self.client.get(path, params=params) as r:
            return r.status, dict(r.headers), await r.read()


def error(body: bytes) -> tuple[int, str]:
    m = ERROR_RE.match(body.decode())
    assert m, body
    return int(m.group(1)), m.group(2)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    client, state, table, catalog = await serve_fake_api(str(tmp_path), {"max_body_bytes": 4096})
    try:
        yield Api(client, state, table, catalog)
    finally:
        await client.close()


# ---- INSERT ---------------------------------------------------------------------------------------------


async def test_insert_tsv_returns_summary_body_and_header(api: Api) -> None:
    status, headers, body = await api.post("INSERT INTO db.events FORMAT TabSeparated", ROWS)
    assert status == 200
    assert json.loads(body) == {"written_rows": 2, "written_parts": 1, "deduplicated_blocks": 0,
                                "written_bytes": api.table.blocks[0].nbytes, "read_rows": 0, "read_bytes": 0,
                                "total_rows_to_read": 0}
    summary = json.loads(headers["X-ClickHouse-Summary"])
    assert summary["written_rows"] == "2" and summary["written_parts"] == "1" and summary["read_rows"] == "0"
    assert headers["X-ClickHouse-Query-Id"]
    assert api.table.table().column("kind").to_pylist() == [b"click", b"view"]
    assert api.table.insert_settings[0].insert_deduplicate is True
    assert api.table.insert_settings[0].max_insert_block_size == 1048576


async def test_query_in_the_body_first_line(api: Api) -> None:
    data = b"INSERT INTO db.events (user_id, kind) FORMAT CSV\n7,\"x\"\n8,y\n"
    status, _, body = await api.post(None, data)
    assert status == 200, body
    assert api.table.received_columns == [["user_id", "kind"]]
    t = api.table.table()
    assert t.column("user_id").to_pylist() == [7, 8] and t.column("d").to_pylist()[0].year == 1970
    status, _, body = await api.post("INSERT INTO db.events FORMAT JSONEachRow {\"user_id\": 9}")
    assert status == 200 and json.loads(body)["written_rows"] == 1
    status, _, body = await api.post(None, b"insert into events format TSV\n", database="db")
    assert status == 200 and json.loads(body)["written_rows"] == 0


async def test_insert_settings_from_url(api: Api) -> None:
    status, _, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS, insert_quorum="2",
                                     insert_quorum_timeout="1000", insert_deduplicate="0",
                                     insert_deduplication_token="tok", max_insert_block_size="1")
    assert status == 200
    s = api.table.insert_settings[0]
    assert (s.insert_quorum, s.insert_quorum_timeout_ms, s.insert_deduplicate, s.insert_deduplication_token,
            s.max_insert_block_size) == (2, 1000, False, "tok", 1)
    assert json.loads(body)["written_parts"] == 2  # one block per row


async def test_retried_insert_is_deduplicated(api: Api) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    status, _, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    summary = json.loads(body)
    assert status == 200 and (summary["written_rows"], summary["written_parts"],
                              summary["deduplicated_blocks"]) == (0, 0, 1)


@pytest.mark.parametrize("query,params,data,status,code,needle", [
    ("INSERT INTO db.events FORMAT TSV", {"bogus_setting": "1"}, ROWS, 400, 115,
     "Unknown setting bogus_setting"),
    ("INSERT INTO db.events FORMAT TSV", {"index_granularity": "1"}, ROWS, 400, 115, "Unknown setting"),
    ("INSERT INTO db.events FORMAT TSV", {"insert_quorum": "x"}, ROWS, 400, 26, "insert_quorum"),
    ("INSERT INTO db.events FORMAT TSV", {}, b"2020-01-01\t2020-01-01 00:00:00\t-1\tk\n", 400, 27,
     "column user_id, row 1"),
    ("INSERT INTO db.nope FORMAT TSV", {}, ROWS, 404, 60, "db.nope"),
    ("INSERT INTO db.events (nope) FORMAT TSV", {}, b"1\n", 400, 16, "No such column nope"),
    ("INSERT INTO db.events FORMAT Pretty", {}, ROWS, 400, 73, "Pretty"),
    ("INSERT INTO db.events VALUES (1)", {}, b"", 400, 73, "VALUES"),
    ("INSERT INTO db.events FORMAT TSV", {}, ROWS * 100, 413, 307, "max_body_bytes"),
    ("SELEKT 1", {}, b"", 400, 62, "SELEKT"),
])
async def test_insert_errors(api: Api, query: str, params: dict[str, str], data: bytes, status: int,
                             code: int, needle: str) -> None:
    got, headers, body = await api.post(query, data, **params)
    assert got == status
    assert headers["X-ClickHouse-Exception-Code"] == str(code)
    assert error(body)[0] == code and needle in error(body)[1]


async def test_body_too_large_without_content_length(api: Api) -> None:
    async def gen() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield ROWS

    async with api.client.post("/", params={"query": "INSERT INTO db.events FORMAT TSV"}, data=gen()) as r:
        assert r.status == 413 and error(await r.read())[0] == 307
    assert api.table.blocks == []


async def test_readonly_too_many_parts_and_quorum(api: Api) -> None:
    api.table.readonly = True
    status, _, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    assert status == 503 and error(body)[0] == 242
    status, _, body = await api.post("ALTER TABLE db.events DELETE WHERE 1")
    assert status == 503
    api.table.readonly = False
    api.table.fail_insert = TooManyPartsError("Too many parts (300). Merges are processing slower")
    status, headers, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    assert status == 429 and headers["Retry-After"] == "1" and error(body)[0] == 252
    api.table.fail_insert = QuorumError("Number of alive replicas (1) is less than requested quorum (2)")
    status, _, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    assert status == 503 and error(body)[0] == 286  # the replica set cannot satisfy it now: retriable
    metrics = (await api.get("/metrics"))[2].decode()
    assert 'replicad_insert_errors_total{code="252",table="db.events"} 1.0' in metrics


async def test_writes_refused_while_shutting_down_but_reads_work(api: Api) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    server = ApiServer(api.state)
    await server.stop_writes(timeout_s=1)
    status, _, body = await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    assert status == 503 and "shutting down" in error(body)[1]
    status, _, body = await api.get("/", query="SELECT count() FROM db.events")
    assert status == 200 and body == b"2\n"


async def test_stop_writes_waits_for_running_inserts(api: Api) -> None:
    server = ApiServer(api.state)
    release = asyncio.Event()

    async def insert() -> None:
        async with api.state.write():
            await release.wait()

    running = asyncio.create_task(insert())
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(server.stop_writes(timeout_s=5))
    await asyncio.sleep(0.05)
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 1)
    await running


# ---- SELECT ---------------------------------------------------------------------------------------------


async def test_select_formats(api: Api) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    status, headers, body = await api.get("/", query="SELECT * FROM db.events")
    assert status == 200 and body == ROWS and headers["X-ClickHouse-Format"] == "TabSeparated"
    assert headers["Content-Type"].startswith("text/tab-separated-values")
    _, _, body = await api.get("/", query="SELECT kind, user_id FROM db.events ORDER BY user_id DESC LIMIT 1 "
                                          "FORMAT JSONEachRow")
    assert body == b'{"kind":"view","user_id":"6"}\n'
    _, _, body = await api.get("/", query="SELECT user_id FROM db.events", default_format="CSV")
    assert body == b"5\n6\n"
    _, _, body = await api.get("/", query="SELECT count() FROM db.events WHERE kind = 'x' FORMAT JSONEachRow")
    assert body == b'{"count()":"2"}\n'
    _, _, body = await api.post(None, b"SELECT count()\nFROM db.events")  # whole body is the query
    assert body == b"2\n"
    _, _, body = await api.get("/", query="SELECT 1")
    assert body == b"1\n"


async def test_a_one_piece_answer_is_sent_whole_and_a_longer_one_streams(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    status, headers, body = await api.get("/", query="SELECT count() FROM db.events")
    assert (status, body) == (200, b"2\n")
    assert headers["Content-Length"] == "2" and "Transfer-Encoding" not in headers
    monkeypatch.setattr(output_formats, "RENDER_ROWS", 1)  # a row per piece: two pieces
    _, headers, body = await api.get("/", query="SELECT * FROM db.events")
    assert body == ROWS and headers["Transfer-Encoding"] == "chunked" and "Content-Length" not in headers
    _, headers, body = await api.get("/", query="SELECT * FROM db.events FORMAT TSVWithNames")
    assert body.split(b"\n", 1)[1] == ROWS and headers["Transfer-Encoding"] == "chunked"


async def test_select_errors(api: Api) -> None:
    status, _, body = await api.get("/", query="SELECT * FROM db.events FORMAT Pretty")
    assert status == 400 and error(body)[0] == 73
    status, _, body = await api.get("/", query="SELECT * FROM db.missing")
    assert status == 404 and error(body)[0] == 60
    status, _, body = await api.get("/", query="SELECT nope FROM db.events")
    assert status == 500 and error(body) == (47, "Missing columns: nope")
    status, _, body = await api.get("/", query="INSERT INTO db.events FORMAT TSV")
    assert status == 400 and error(body)[0] == 164
    status, _, body = await api.get("/", query="SELECT kind FROM db.events GROUP BY kind")
    assert status == 400 and error(body)[0] == 48


# ---- statements ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql,kind", [
    ("ALTER TABLE db.events DELETE WHERE user_id = 5", StatementKind.ALTER_DELETE),
    ("ALTER TABLE db.events UPDATE kind = 'x' WHERE 1", StatementKind.ALTER_UPDATE),
    ("ALTER TABLE db.events DROP PARTITION 202001", StatementKind.DROP_PARTITION),
    ("ALTER TABLE db.events DETACH PARTITION 202001", StatementKind.DETACH_PARTITION),
    ("OPTIMIZE TABLE db.events PARTITION 202001 FINAL", StatementKind.OPTIMIZE),
    ("TRUNCATE TABLE db.events", StatementKind.TRUNCATE),
    ("SYSTEM SYNC REPLICA db.events", StatementKind.SYNC_REPLICA),
])
async def test_statements_reach_the_table(api: Api, sql: str, kind: StatementKind) -> None:
    status, _, body = await api.post(sql, mutations_sync="2")
    assert status == 200 and body == b""
    stmt = api.table.statements[-1]
    assert stmt.kind is kind and stmt.text == sql and str(stmt.table) == "db.events"
    assert stmt.settings == {"mutations_sync": 2}


async def test_create_and_drop_table(api: Api) -> None:
    ddl = "CREATE TABLE db.t2 (x UInt64) ENGINE = ReplicatedMergeTree('/t/t2', '{replica}') ORDER BY x"
    assert (await api.post(ddl))[0] == 200
    assert [str(t.name) for t in api.catalog.tables()] == ["db.events", "db.t2"]
    status, _, body = await api.post(ddl)
    assert status == 500 and error(body)[0] == 57
    assert (await api.post(ddl.replace("TABLE", "TABLE IF NOT EXISTS", 1)))[0] == 200
    assert (await api.post("DROP TABLE db.t2"))[0] == 200
    status, _, body = await api.post("DROP TABLE db.t2")
    assert status == 404
    assert (await api.post("DROP TABLE IF EXISTS db.t2"))[0] == 200
    assert (await api.post("TRUNCATE TABLE IF EXISTS db.t2"))[0] == 200


# ---- introspection ---------------------------------------------------------------------------------------


async def test_ping_status_and_tables(api: Api) -> None:
    assert (await api.get("/ping"))[2] == b"Ok.\n"
    assert (await api.get("/replicas_status"))[:3:2] == (200, b"Ok.\n")
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    api.state.supervisor.add(FunctionTask("queue", lambda: asyncio.sleep(0)))  # type: ignore[union-attr]
    status, _, body = await api.get("/status")
    data = json.loads(body)
    assert status == 200 and data["replica"] == "r1" and data["state"] == "running"
    assert data["zookeeper"]["state"] == "connected"
    events = data["tables"]["db.events"]
    assert list(events)[:4] == ["database", "table", "is_leader", "is_readonly"]
    assert events["active_parts"] == 1 and events["queue_size"] == 0
    assert data["tasks"][0]["name"] == "queue" and data["tasks"][0]["restarts"] == 0
    parts = json.loads((await api.get("/tables/db.events/parts"))[2])
    assert parts == [{"database": "db", "table": "events", "engine": "ReplicatedMergeTree",
                      "name": "all_0_0_0", "rows": 2, "active": True}]
    assert json.loads((await api.get("/tables/db.events/queue"))[2]) == []
    assert (await api.get("/tables/db.missing/parts"))[0] == 404
    assert (await api.get("/tables/db.events/other"))[0] == 404
    api.table.readonly = True
    status, _, body = await api.get("/replicas_status")
    assert status == 503 and body == b"db.events:\tis read-only.\n"


async def test_metrics(api: Api) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    status, headers, body = await api.get("/metrics")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'replicad_inserted_rows_total{table="db.events"} 2.0' in text
    assert 'replicad_inserted_parts_total{table="db.events"} 1.0' in text
    assert 'replicad_replica_queue_size{table="db.events"} 0.0' in text
    assert 'replicad_active_parts{table="db.events"} 1.0' in text
    assert "replicad_keeper_session_connected 1.0" in text
    assert 'replicad_http_requests_total{code="200",handler="/",query="insert"} 1.0' in text
    await api.get("/", query="SELECT count() FROM db.events")
    await api.post("INSERT INTO db.events FORMAT TSV", b"not\ta\trow\n")
    await api.post("OPTIMIZE TABLE db.events")
    text = (await api.get("/metrics"))[2].decode()
    assert 'replicad_http_requests_total{code="200",handler="/",query="select"} 1.0' in text
    assert 'replicad_http_requests_total{code="400",handler="/",query="insert"} 1.0' in text
    assert 'replicad_http_requests_total{code="200",handler="/",query="optimize"} 1.0' in text
    # ClickHouse's names (per server, no labels), as its Prometheus endpoint writes them
    ch = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
          if ln.startswith("ClickHouse")}
    assert ch["ClickHouseProfileEvents_Query"] == 4 and ch["ClickHouseProfileEvents_InsertQuery"] == 2
    assert ch["ClickHouseProfileEvents_SelectQuery"] == 1
    assert ch["ClickHouseProfileEvents_FailedQuery"] == ch["ClickHouseProfileEvents_FailedInsertQuery"] == 1
    assert ch["ClickHouseProfileEvents_InsertedRows"] == 2
    assert ch["ClickHouseMetrics_Query"] == 0  # none running (a scrape is not a query)
    assert ch["ClickHouseMetrics_ReadonlyReplica"] == 0
    assert "process_cpu_seconds_total" in text and "python_gc_objects_collected_total" in text


async def test_starting_replica_waits_bounded_then_answers_503_but_pings(tmp_path: Path) -> None:
    cfg = build_config({"replica": "r1", "data_path": str(tmp_path), "api": {"startup_wait_s": 0.3}}, {})
    state = ApiState(config=cfg, metrics=Metrics())
    async with TestClient(TestServer(create_app(state))) as client:
        assert (await client.get("/ping")).status == 200
        started = asyncio.get_running_loop().time()
        r = await client.get("/", params={"query": "SELECT count() FROM db.events"})
        assert r.status == 503 and "starting" in await r.text()
        assert asyncio.get_running_loop().time() - started >= 0.3  # it waited for the tables first
        assert (await client.get("/replicas_status")).status == 503
        data = await (await client.get("/status")).json()
        assert data["state"] == "starting" and data["tables"] == {}


async def test_request_during_start_up_waits_for_the_tables(tmp_path: Path) -> None:
    """An insert sent the instant /ping answers, before the tables are loaded, succeeds once they are."""
    cfg = build_config({"replica": "r1", "data_path": str(tmp_path)}, {})
    state = ApiState(config=cfg, metrics=Metrics())
    catalog = FakeCatalog()
    catalog.add("db.events", [("d", "Date"), ("ts", "DateTime"), ("user_id", "UInt64"), ("kind", "String")])
    async with TestClient(TestServer(create_app(state))) as client:
        assert (await client.get("/ping")).status == 200
        insert = asyncio.ensure_future(client.post("/", params={"query": "INSERT INTO db.events FORMAT TSV"},
                                                   data=ROWS))
        await asyncio.sleep(0.3)
        assert not insert.done()
        state.set_catalog(catalog)
        state.state = "running"
        r = await asyncio.wait_for(insert, 10)
        assert r.status == 200, await r.text()
        r = await client.get("/", params={"query": "SELECT count() FROM db.events"})
        assert r.status == 200 and (await r.text()).strip() == str(ROWS.count(b"\n"))


async def test_select_through_the_full_parser(api: Api) -> None:
    await api.post("INSERT INTO db.events FORMAT TSV", ROWS)
    more = ROWS.replace(b"\t5\t", b"\t7\t").replace(b"\t6\t", b"\t8\t")
    await api.post("INSERT INTO db.events FORMAT TSV", more)
    _, _, body = await api.get("/", query="SELECT user_id FROM db.events ORDER BY user_id LIMIT 1, 2")
    assert body == b"6\n7\n"
    _, _, body = await api.get("/", query="SELECT user_id FROM events ORDER BY user_id DESC LIMIT 2 OFFSET 3",
                               database="db")
    assert body == b"5\n"
    status, _, body = await api.get("/", query="SELECT user_id FROM db.events WHERE (user_id = ")
    assert status == 400 and error(body)[0] == 62
    status, _, body = await api.post("ALTER TABLE db.events DELETE WHERE user_id = ")
    assert status == 400 and error(body)[0] == 62
    assert api.table.statements == []
    assert (await api.post("ALTER TABLE db.events DELETE WHERE user_id = 5"))[0] == 200
    parsed = api.table.statements[-1].parsed
    assert parsed is not None and parsed.mutation_commands_text() == "DELETE WHERE user_id = 5 "


@pytest.mark.parametrize("sql,limit,offset", [
    ("SELECT a FROM t LIMIT 3", 3, 0), ("SELECT a FROM t LIMIT 2, 3", 5, 2),
    ("SELECT a FROM t LIMIT 3 OFFSET 2", 5, 2), ("SELECT a FROM t", None, 0),
])
def test_routing_limit_offset(sql: str, limit: int | None, offset: int) -> None:
    r = route(sql)
    assert isinstance(r, SelectRoute) and r.query.limit == limit and r.offset == offset


def test_routing_insert_keeps_inline_data_untouched() -> None:
    r = route("INSERT INTO db.t (a, `b c`) FORMAT TSV -- not a comment\t1;\n")
    assert isinstance(r, InsertRoute)
    assert r.columns == ("a", "b c") and r.format == "TSV" and r.inline_data == "-- not a comment\t1;\n"
    s = route("/* c */ SELECT x FROM t WHERE s = 'FROM ORDER BY' -- trailing\n")
    assert isinstance(s, SelectRoute) and s.query.where == "s = 'FROM ORDER BY'"
    assert isinstance(route("system sync replica db.t"), StatementRoute)


@pytest.mark.parametrize(("rows", "trips"), [(20_000, 1), (110_000, 3)])
async def test_a_body_of_one_read_block_is_parsed_in_one_worker_trip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, trips: int) -> None:
    """A 10k-row insert's ~0.7 MB (here ~0.8 MB) is read whole and parsed in one trip to a worker thread;
    a body larger than a read block (4 MiB, here ~4.3 MB) is streamed: a trip for the column list, one per
    block, one for the end, at least."""
    from replicad.server import formats
    runs: list[object] = []
    real = formats._run

    async def counting(fn: Any, *args: Any) -> Any:
        runs.append(fn)
        return await real(fn, *args)

    monkeypatch.setattr(formats, "_run", counting)
    line = b"2020-01-02\t2020-01-02 03:04:05\t5\tclick\n"
    data = line * rows
    assert (len(data) <= formats.SMALL_BODY_BYTES) == (trips == 1)
    client, _state, table, _catalog = await serve_fake_api(str(tmp_path), {"max_body_bytes": 64 << 20})
    try:
        async with client.post("/", params={"query": "INSERT INTO db.events FORMAT TSV"}, data=data) as r:
            assert r.status == 200, await r.text()
        assert table.table().num_rows == rows
        assert len(runs) == 1 if trips == 1 else len(runs) >= trips
    finally:
        await client.close()
