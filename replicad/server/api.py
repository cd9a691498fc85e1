"""The HTTP API (aiohttp) on ``api.listen_host:api.port``, with ClickHouse's HTTP conventions.

* ``POST /?query=INSERT INTO db.t [(c1, c2)] FORMAT F`` + data (or the query as the body's first line);
  200 with a JSON summary, also in ``X-ClickHouse-Summary``;
* ``GET|POST /?query=SELECT …`` (output: TabSeparated unless ``FORMAT``/``default_format`` says otherwise);
* ``POST /?query=CREATE TABLE|DROP TABLE|ALTER …|OPTIMIZE|TRUNCATE|SYSTEM SYNC REPLICA``;
* ``GET /ping``, ``/replicas_status``, ``/status``, ``/tables/<db>.<t>/parts|queue|mutations``, ``/metrics``.

Errors answer ``Code: <n>. DB::Exception: <message>`` with ClickHouse's code in
``X-ClickHouse-Exception-Code`` and the status of the error class (400, 404, 413, 429 + Retry-After, 503).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

import pyarrow as pa
from aiohttp import web

from replicad import stage_times
from replicad.config import Config
from replicad.datatypes import parse_type
from replicad.ddl import service as ddl_service  # deferred in the daemon (replicad.memory)
from replicad.errors import (
    BadInputError,
    BodyTooLargeError,
    NotEnoughSpaceError,
    ReadOnlyError,
    ReplicadError,
    SyntaxError_,
    TooManyPartsError,
    UnknownTableError,
)
from replicad.logging import get_logger
from replicad.memory import RELEASE_AFTER_BYTES, deferred_loaded
from replicad.server import auth, fault_injection, http_body, staging_api, system_queries, tls
from replicad.server import formats as input_formats  # deferred in the daemon (replicad.memory)
from replicad.server import status as status_mod
from replicad.server.insert_input import input_spec, spool_dir
from replicad.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from replicad.server.metrics import Metrics
from replicad.server.output_formats import content_type
from replicad.server.query_settings import insert_settings, query_setting, request_query_id, url_settings
from replicad.server.routing import (
    InsertRoute,
    SelectRoute,
    StatementRoute,
    on_cluster_of,
    parse_full,
    resolve,
    without_compute,
)
from replicad.server.sync_body import ParsePool
from replicad.service import (
    Catalog,
    QueryResult,
    Statement,
    StatementKind,
    TableName,
)
from replicad.tasks import Supervisor

log = get_logger(__name__)
MAX_QUERY_BYTES = 1 << 20  # a statement sent in the body (not counting INSERT data)
MAX_URI_BYTES = 1 << 20  # ClickHouse's http_max_uri_size
READONLY_CODE = 164  # READONLY: GET requests may only read


def version() -> str:
    try:
        return metadata.version("replicad")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@dataclass
class ApiState:
    """What the handlers need; the daemon fills ``catalog``/``supervisor`` once the engine is up."""

    config: Config
    metrics: Metrics
    catalog: Catalog | None = None
    supervisor: Supervisor | None = None
    state: str = "starting"  # starting / running / stopping
    accepting_writes: bool = True
    started_at: float = field(default_factory=time.monotonic)
    inflight_writes: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    parse_pool: ParsePool | None = None  # made with the app (api.insert_parse_threads)
    #: where Parquet / Arrow file bodies are spooled (``data_path/tmp``, made when the server starts); None:
    #: the system's temporary directory
    spool_dir: str | None = None

    def set_catalog(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.loaded.set()

    async def require_catalog(self) -> Catalog:
        """The catalog; while the daemon is still loading its tables, wait for them (``api.startup_wait_s``),
        so a request sent the instant ``/ping`` answers succeeds instead of failing with 503."""
        if self.catalog is None and self.state == "starting":
            try:
                await asyncio.wait_for(self.loaded.wait(), self.config.api.startup_wait_s)
            except TimeoutError:
                pass
        if self.catalog is None:
            raise ReadOnlyError(f"Replica is starting: tables are not loaded yet (waited "
                                f"{self.config.api.startup_wait_s:.0f}s, api.startup_wait_s)")
        return self.catalog

    @asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        if not self.accepting_writes:
            raise ReadOnlyError("Replica is shutting down: writes are refused")
        self.inflight_writes += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.inflight_writes -= 1
            if self.inflight_writes == 0:
                self.idle.set()


# ---- errors --------------------------------------------------------------------------------------------


STATE = web.AppKey("state", ApiState)


def error_response(e: ReplicadError) -> web.Response:
    headers = {"X-ClickHouse-Exception-Code": str(e.code)}
    if isinstance(e, TooManyPartsError):
        headers["Retry-After"] = str(max(1, int(getattr(e, "retry_after", 1))))
    return web.Response(status=e.http_status, text=http_body.error_text(e), headers=headers,
                        content_type="text/plain", charset="utf-8")


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    metrics: Metrics = request.app[STATE].metrics
    started = time.monotonic()
    clock = stage_times.start() if request.method == "POST" else None
    name = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
    try:
        resp = await handler(request)
    except ReplicadError as e:
        log.info("request_failed", path=request.path, code=e.code, status=e.http_status, error=str(e)[:300])
        resp = error_response(e)
    except web.HTTPException as e:  # 404 for unknown paths, 405 …: aiohttp renders them
        _finish_query(request, metrics, failed=e.status >= 400)
        metrics.http_requests.labels(name, request.get(QUERY_KIND, ""), str(e.status)).inc()
        raise
    except (RecursionError, OverflowError) as e:  # client input too deep or too large for a number: a 4xx
        log.info("request_failed", path=request.path, error=f"{type(e).__name__}: {e}"[:300])
        client_error = BadInputError(
            "The query is nested too deeply" if isinstance(e, RecursionError)
            else f"A value is out of range: {e}", code=306 if isinstance(e, RecursionError) else 69)
        resp = error_response(client_error)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            log.error("request_crashed", path=request.path, error=f"{type(e).__name__}: {e}", exc_info=True)
            resp = error_response(ReplicadError(f"{type(e).__name__}: {e.strerror}", code=1001))
        else:  # the disk is full: 507, retriable, no machine path in the answer
            log.error("request_failed_disk_full", path=request.path, error=str(e))
            resp = error_response(NotEnoughSpaceError(f"Cannot write to disk: {e.strerror}"))
    except Exception as e:
        log.error("request_crashed", path=request.path, error=f"{type(e).__name__}: {e}", exc_info=True)
        resp = error_response(ReplicadError(f"{type(e).__name__}: {e}", code=1001))
    except BaseException:  # cancelled (client gone): still count the query as finished
        _finish_query(request, metrics, failed=True)
        raise
    if resp.status >= 400 and request.body_exists and not request.content.at_eof():
        # the body was not read to its end: the connection closes after this answer, so say so (a client
        # that reused it would see it reset under its next request)
        resp.force_close()
    _finish_query(request, metrics, failed=resp.status >= 400)
    kind = request.get(QUERY_KIND, "")
    metrics.http_requests.labels(name, kind, str(resp.status)).inc()
    metrics.http_duration.labels(name, kind).observe(time.monotonic() - started)
    if clock is not None:
        _log_stages(clock)
    return resp


def _log_stages(clock: stage_times.StageClock) -> None:
    """The ``insert_stages`` line of an INSERT (REPLICAD_INSERT_STAGES=1; see replicad.stage_times)."""
    stage_times.stop()
    if not clock.marks:  # not an INSERT
        return
    clock.mark("finish")
    asyncio.get_running_loop().call_soon(functools.partial(  # after the answer is written, as insert_done
        log.info, "insert_stages", wall0=round(clock.wall0, 6), us=clock.durations_us(), zk=dict(clock.zk)))


QUERY_KIND = web.RequestKey("query_kind", str)
QUERY_FINISHED = web.RequestKey("query_finished", bool)


def _start_query(request: web.Request, metrics: Metrics, kind: str) -> None:
    """Label the request with its query kind (insert, select, or the statement kind) and count it."""
    request[QUERY_KIND] = kind
    metrics.events.query_started(kind)


def _finish_query(request: web.Request, metrics: Metrics, *, failed: bool) -> None:
    kind = request.get(QUERY_KIND)
    if kind is not None and not request.get(QUERY_FINISHED):
        request[QUERY_FINISHED] = True
        metrics.events.query_finished(kind, failed)


async def _read_first_line(content: Any) -> tuple[str, bytes]:
    """The body's first line (the statement) and the bytes already read after it."""
    buf = bytearray()
    while True:
        i = buf.find(b"\n")
        if i >= 0:
            return buf[:i].decode("utf-8", "replace"), bytes(buf[i + 1:])
        if len(buf) > MAX_QUERY_BYTES:
            raise BodyTooLargeError(f"Query is longer than {MAX_QUERY_BYTES} bytes")
        chunk = await content.read(65536)
        if not chunk:
            return buf.decode("utf-8", "replace"), b""
        buf += chunk


async def _read_rest(content: Any, prefix: bytes) -> str:
    buf = bytearray(prefix)
    while chunk := await content.read(65536):
        buf += chunk
        if len(buf) > MAX_QUERY_BYTES:
            raise BodyTooLargeError(f"Query is longer than {MAX_QUERY_BYTES} bytes")
    return buf.decode("utf-8", "replace")


#: statements longer than this are parsed in a worker thread (parsing is pure Python: a long IN list takes
#: seconds the event loop must not lose)
PARSE_INLINE_BYTES = 4096
_T = TypeVar("_T")


async def _off_loop_if_long(text: str, fn: Callable[..., _T], *args: Any) -> _T:
    if len(text) <= PARSE_INLINE_BYTES:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _check_query_size(text: str, config: Config, given: Mapping[str, Any]) -> None:
    """ClickHouse's ``max_query_size`` (the URL's, else the config's ``settings:``): the statement (for
    INSERT, the text before the data) is refused when longer, before it is parsed."""
    limit = int(query_setting(config, given, "max_query_size"))
    if _is_insert(text):
        text = text.split("\n", 1)[0]
    size = len(text.encode("utf-8", "replace")) if len(text) * 4 > limit else len(text)
    if size > limit:
        raise SyntaxError_(f"Max query size exceeded: the query is {size} bytes, max_query_size is {limit}",
                           code=62)


def _is_insert(text: str) -> bool:
    return text.lstrip()[:6].upper() == "INSERT"


# ---- handlers ------------------------------------------------------------------------------------------


async def handle_query(request: web.Request) -> web.StreamResponse:
    state: ApiState = request.app[STATE]
    params = request.query
    given = url_settings(params)
    query_id = request_query_id(params.get("query_id"))
    prefix = b""
    text = params.get("query")
    has_body = request.method == "POST" and request.can_read_body
    if text is None:
        if not has_body:
            raise SyntaxError_("Empty query", code=62)
        text, prefix = await _read_first_line(http_body.request_body(request))
        if not _is_insert(text):
            text = text + "\n" + await _read_rest(http_body.request_body(request), prefix)
            prefix = b""
    elif has_body and not _is_insert(text):
        extra = await _read_rest(http_body.request_body(request), b"")
        if extra.strip():
            text = text + "\n" + extra
    _check_query_size(text, state.config, given)
    headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Server-Display-Name": state.config.replica}
    system = await system_queries.answer(text, system_queries.ServerContext(
        state.config, params.get("database") or "default", state.started_at), state.require_catalog)
    if system is not None:  # version(), system.settings, DESCRIBE …: what clients ask about the server
        _start_query(request, state.metrics, "select")
        fmt = system.format or params.get("default_format") or "TabSeparated"
        return await http_body.send_result(request, system.result, fmt, headers, state.config.timezone,
                                           content_type(fmt), text)
    r = await _off_loop_if_long(text, resolve, text, params.get("database") or "default")
    auth.check_route(r)
    if request.method != "POST" and not isinstance(r, SelectRoute):
        raise BadInputError("Cannot execute a query that writes with a GET request: use POST",
                            code=READONLY_CODE)
    _start_query(request, state.metrics, "insert" if isinstance(r, InsertRoute) else
                 "select" if isinstance(r, SelectRoute) else r.kind.value)
    if not without_compute(r):
        await deferred_loaded()  # pyarrow.compute, in a worker thread the first time (replicad.memory)
    if isinstance(r, InsertRoute):
        if r.inline_data:
            prefix = (r.inline_data + "\n").encode() + prefix
        return await _insert(request, state, r, given, query_id, prefix, headers)
    if isinstance(r, SelectRoute):
        return await _select(request, state, r, params, given, headers)
    return await _statement(state, r, text, given, headers)


async def _insert(request: web.Request, state: ApiState, r: InsertRoute, given: Mapping[str, Any],
                  query_id: str, prefix: bytes, headers: dict[str, str]) -> web.Response:
    stage_times.mark("route")
    cfg = state.config
    table = (await state.require_catalog()).get(r.table)
    limit = cfg.api.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLargeError(f"Request body of {request.content_length} bytes is larger than "
                                f"api.max_body_bytes = {limit}")
    async with state.write():
        if table.is_readonly:
            raise ReadOnlyError(f"Table {table.name} is in readonly mode (no ZooKeeper session)")
        settings = insert_settings(cfg, given, query_id)
        pool = state.parse_pool
        spec = input_spec(cfg, table, r, settings.max_insert_block_size, given, pool, state.spool_dir)
        if pool is not None:
            pool.enter()
        try:
            length = request.content_length
            small = (length is not None and length <= input_formats.SMALL_BODY_BYTES
                     and request.headers.get("Content-Encoding", "").strip().lower() in ("", "identity"))
            name = str(table.name)
            source = http_body.request_body(request)
            if small:  # parsed whole here: bad rows count as insert errors, as when parsed during the insert
                try:
                    parsed = await input_formats.parse_body(source, spec, limit, prefix, whole=True)
                except ReplicadError as e:
                    state.metrics.insert_errors.labels(name, str(e.code)).inc()
                    raise
            else:
                parsed = await input_formats.parse_body(source, spec, limit, prefix)
            stage_times.mark("parse_start")
            try:
                summary = await table.insert(parsed.batches, parsed.columns, settings)
            except ReplicadError as e:
                state.metrics.insert_errors.labels(name, str(e.code)).inc()
                raise
            finally:
                await parsed.batches.aclose()  # type: ignore[attr-defined]
                stage_times.mark("parse_close")
                state.metrics.body_bytes.inc(parsed.body.bytes_read)
                if parsed.body.bytes_read >= RELEASE_AFTER_BYTES and pool is not None:
                    pool.release_memory_soon()
        finally:
            if pool is not None:
                pool.leave()
    m = state.metrics
    m.events.add("InsertedRows", summary.written_rows)
    m.events.add("InsertedBytes", summary.written_bytes)
    m.events.add("DuplicatedInsertedBlocks", summary.deduplicated_blocks)
    m.inserted_rows.labels(name).inc(summary.written_rows)
    m.inserted_bytes.labels(name).inc(summary.written_bytes)
    m.inserted_parts.labels(name).inc(summary.written_parts)
    m.deduplicated_blocks.labels(name).inc(summary.deduplicated_blocks)
    # logged once the answer is written (aiohttp writes it in this task step): the line's rendering and its
    # write (a system call that lets go of the GIL) are no longer in the acknowledgement's time
    asyncio.get_running_loop().call_soon(functools.partial(
        log.info, "insert_done", table=name, query_id=query_id, format=r.format, rows=summary.written_rows,
        parts=summary.written_parts, deduplicated_blocks=summary.deduplicated_blocks))
    headers["X-ClickHouse-Summary"] = json.dumps(summary.header_dict(), separators=(",", ":"))
    resp = web.json_response(summary.to_dict(), headers=headers)
    stage_times.mark("respond")
    return resp


async def _select(request: web.Request, state: ApiState, r: SelectRoute, params: Mapping[str, str],
                  given: Mapping[str, Any], headers: dict[str, str]) -> web.StreamResponse:
    fmt = r.format or params.get("default_format") or "TabSeparated"
    ctype = content_type(fmt)
    if r.constant is not None:
        is_int = r.constant.lstrip("+-").isdigit()
        dtype = parse_type("Int64" if is_int else "String")
        value = pa.array([int(r.constant)] if is_int else [r.constant.encode()], dtype.arrow_type)
        result = QueryResult.from_table([(r.constant, dtype)], pa.table({r.constant: value}))
    else:
        table = (await state.require_catalog()).get(r.query.table)
        if r.is_count:
            n = await table.count(r.query.where)
            counted = pa.table({"count()": pa.array([n], pa.uint64())})
            result = QueryResult.from_table([("count()", parse_type("UInt64"))], counted)
        else:
            query = dataclasses.replace(
                r.query, max_rows_to_sort=int(query_setting(state.config, given, "max_rows_to_sort")),
                max_bytes_to_sort=int(query_setting(state.config, given, "max_bytes_to_sort")))
            result = await table.select(query)
            if r.offset:
                result = QueryResult(result.columns, _skip_rows(result.batches, r.offset))
    return await http_body.send_result(request, result, fmt, headers, state.config.timezone, ctype,
                                       r.query.text)


async def _skip_rows(batches: AsyncIterator[pa.RecordBatch], n: int) -> AsyncIterator[pa.RecordBatch]:
    """LIMIT … OFFSET n: drop the first ``n`` rows."""
    async for b in batches:
        if n >= b.num_rows:
            n -= b.num_rows
            continue
        yield b.slice(n)
        n = 0


async def _statement(state: ApiState, r: StatementRoute, text: str, given: Mapping[str, Any],
                     headers: dict[str, str]) -> web.Response:
    catalog = await state.require_catalog()
    parsed = await _off_loop_if_long(text, parse_full, text)
    stmt = Statement(kind=r.kind, table=r.table, text=text, parsed=parsed, if_exists=r.if_exists,
                     settings=dict(given))
    message = ""
    cluster = on_cluster_of(parsed)
    if cluster is not None:  # distributed DDL through ZooKeeper's task queue (replicad.ddl)
        ddl = getattr(catalog, "ddl", None)
        if ddl is None:
            raise ReplicadError("… ON CLUSTER needs `distributed_ddl` and `clusters` in the configuration",
                                code=139)
        ddl.check(r.kind, parsed)
        timeout = float(given.get("distributed_ddl_task_timeout", ddl.settings.task_timeout))
        async with state.write():
            rows = await ddl.initiate(text, cluster, timeout)
        return web.Response(text=ddl_service.status_table(rows), headers=headers)
    if r.kind is StatementKind.SYNC_REPLICA:
        result = await catalog.get(r.table).execute(stmt)
        message = result.message
    else:
        async with state.write():
            if r.kind is StatementKind.CREATE_TABLE:
                await catalog.create_table(stmt)
            elif r.kind is StatementKind.DROP_TABLE:
                await catalog.drop_table(stmt)
            elif r.kind in _EVERY_TABLE_WITHOUT_ONE and not r.table.table:  # SYSTEM STOP MERGES: all tables
                for t in catalog.tables():
                    await t.execute(stmt)
            else:
                try:
                    table = catalog.get(r.table)
                except UnknownTableError:
                    if r.if_exists:
                        return web.Response(text="", headers=headers)
                    raise
                if table.is_readonly and r.kind not in _ALLOWED_READONLY:
                    raise ReadOnlyError(f"Table {table.name} is in readonly mode (no ZooKeeper session)")
                message = (await table.execute(stmt)).message
    log.info("statement_done", kind=r.kind.value, table=str(r.table))
    return web.Response(text=message + ("\n" if message else ""), headers=headers)


#: statements without a table that apply to every table
_EVERY_TABLE_WITHOUT_ONE = frozenset((StatementKind.FETCHES, StatementKind.MERGES))
#: statements a read-only table (no ZooKeeper session) still runs: they are local or bring it back
_ALLOWED_READONLY = frozenset((StatementKind.FETCHES, StatementKind.MERGES, StatementKind.RESTART_REPLICA,
                               StatementKind.DROP_DETACHED))


async def handle_ping(request: web.Request) -> web.Response:
    return web.Response(text="Ok.\n")


async def handle_replicas_status(request: web.Request) -> web.Response:
    state: ApiState = request.app[STATE]
    problems = status_mod.replicas_problems(state.catalog, state.config.api.max_replica_delay_s)
    if problems:
        return web.Response(status=503, text="\n".join(problems) + "\n")
    return web.Response(text="Ok.\n")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)


async def handle_status(request: web.Request) -> web.Response:
    state: ApiState = request.app[STATE]
    zk_fields = await status_mod.read_zk_fields(state.catalog) if state.state == "running" else {}
    body = status_mod.build_status(replica=state.config.replica, state=state.state,
                                   started_at=state.started_at, version=version(), catalog=state.catalog,
                                   supervisor=state.supervisor, zk_fields=zk_fields)
    return web.json_response(body, dumps=_dumps)


async def handle_table(request: web.Request) -> web.Response:
    state: ApiState = request.app[STATE]
    try:
        name = TableName.parse(request.match_info["name"])
    except ValueError as e:
        raise BadInputError(str(e)) from None
    table = (await state.require_catalog()).get(name)
    what = request.match_info["what"]
    rows = status_mod.table_rows(table, what)
    if what == "parts":
        rows = await asyncio.to_thread(status_mod.add_part_sizes, rows)
    return web.json_response(rows, dumps=_dumps)


async def handle_metrics(request: web.Request) -> web.Response:
    state: ApiState = request.app[STATE]
    await status_mod.refresh_zk_fields(state.catalog)  # ZooKeeper fields no older than 30 s, read on demand
    body = await asyncio.to_thread(state.metrics.render)
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


def create_app(state: ApiState) -> web.Application:
    app = web.Application(middlewares=[_errors, auth.middleware(lambda: state.config.api.users)],
                          client_max_size=MAX_QUERY_BYTES)
    app[STATE] = state
    if state.parse_pool is None:
        state.parse_pool = ParsePool(state.config.api.max_concurrent_inserts)
    app.router.add_route("GET", "/", handle_query)
    app.router.add_route("POST", "/", handle_query)
    app.router.add_get("/ping", handle_ping)
    app.router.add_get("/replicas_status", handle_replicas_status)
    app.router.add_get("/status", handle_status)
    app.router.add_get(r"/tables/{name}/{what:parts|queue|mutations}", handle_table)
    app.router.add_get("/metrics", handle_metrics)
    staging_api.add_routes(app, state.require_catalog)
    if fault_injection.enabled():  # test builds only: REPLICAD_FAULT_INJECTION=1 in the environment
        fault_injection.add_routes(app, lambda: state.supervisor)
    return app


class ApiServer:
    """Runs the app on ``api.listen_host:api.port``; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, state: ApiState, host: str | None = None, port: int | None = None) -> None:
        self.state = state
        self.host = host if host is not None else state.config.api.listen_host
        self.port = port if port is not None else state.config.api.port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        # ClickHouse's http_max_uri_size (1 MiB): a long SELECT in ?query= reaches the statement checks
        # (max_query_size, answered in ClickHouse's error format) instead of aiohttp's 8 KiB line limit
        self._runner = web.AppRunner(create_app(self.state), access_log=None, handle_signals=False,
                                     shutdown_timeout=5.0, max_line_size=MAX_URI_BYTES, max_field_size=65536)
        await self._runner.setup()
        self.state.spool_dir = await asyncio.to_thread(spool_dir, self.state.config.tmp_path)
        api = self.state.config.api
        ssl_context = await asyncio.to_thread(tls.server_context, api.tls_cert_file, api.tls_key_file)
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("api_listening", host=self.host, port=self.port, tls=ssl_context is not None,
                 users=len(api.users))

    async def stop_listening(self) -> None:
        """Close the listening socket: no new connection; open connections and their requests go on until
        :meth:`stop`."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
            log.info("api_listener_closed", port=self.port)

    async def stop_writes(self, timeout_s: float) -> None:
        """Refuse new inserts/statements (503) and wait for the running ones."""
        self.state.accepting_writes = False
        if self.state.inflight_writes:
            log.info("api_draining", inflight=self.state.inflight_writes, timeout_s=timeout_s)
            try:
                await asyncio.wait_for(self.state.idle.wait(), timeout_s)
            except TimeoutError:
                log.warning("api_drain_timeout", inflight=self.state.inflight_writes)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info("api_stopped")
        if self.state.parse_pool is not None:
            self.state.parse_pool.shutdown()
            self.state.parse_pool = None
