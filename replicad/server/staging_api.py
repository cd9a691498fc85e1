"""HTTP routes of two-phase writes (the Spark writer's driver side): commit, abort, status of a run.

* ``POST /staging/commit`` body ``{"table": "db.t", "job_id": "...", "run": "<hex>", "tasks": [{"r": replica,
  "t": task, "b": [batch, ...], "n": rows}, ...]}`` → ``{"state": "committed"|"already_committed", ...}``;
* ``POST /staging/abort`` body ``{"table": "db.t", "job_id": "...", "run": "<hex>"}``;
* ``GET /staging/status?table=db.t&run=<hex>`` → the decision and the tasks not yet published.

Staged inserts themselves are ordinary INSERTs with the ``replicad_stage_run/task/batch`` URL settings.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from replicad.errors import BadInputError, BodyTooLargeError
from replicad.model.staged_job import StagedTask, check_job_id, check_run
from replicad.service import Catalog, TableName, TableService

MAX_COMMIT_BODY = 8 << 20


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_COMMIT_BODY:
        raise BodyTooLargeError(f"Request body larger than {MAX_COMMIT_BODY} bytes")
    raw = await request.content.read(MAX_COMMIT_BODY + 1)
    if len(raw) > MAX_COMMIT_BODY:
        raise BodyTooLargeError(f"Request body larger than {MAX_COMMIT_BODY} bytes")
    try:
        obj = json.loads(raw or b"{}")
    except ValueError as e:
        raise BadInputError(f"Cannot parse the JSON body: {e}", code=27) from None
    if not isinstance(obj, dict):
        raise BadInputError("The JSON body must be an object", code=27)
    return obj


def _string(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise BadInputError(f"Field {key!r} is required (a string)", code=27)
    return value


def add_routes(app: web.Application, catalog: Callable[[], Awaitable[Catalog]]) -> None:
    async def table(name: str) -> TableService:
        try:
            parsed = TableName.parse(name)
        except ValueError as e:
            raise BadInputError(str(e), code=62) from None
        return (await catalog()).get(parsed)

    async def commit(request: web.Request) -> web.Response:
        body = await _json_body(request)
        tasks_raw = body.get("tasks")
        if not isinstance(tasks_raw, list):
            raise BadInputError("Field 'tasks' is required (a list)", code=27)
        tasks = [StagedTask.from_json(t) for t in tasks_raw]
        job_id, run = check_job_id(_string(body, "job_id")), check_run(_string(body, "run"))
        target = await table(_string(body, "table"))
        return web.json_response(await target.staged_commit(job_id, run, tasks))

    async def abort(request: web.Request) -> web.Response:
        body = await _json_body(request)
        job_id, run = check_job_id(_string(body, "job_id")), check_run(_string(body, "run"))
        return web.json_response(await (await table(_string(body, "table"))).staged_abort(run, job_id))

    async def status(request: web.Request) -> web.Response:
        q = request.query
        run = check_run(q.get("run", ""))
        return web.json_response(await (await table(q.get("table", ""))).staged_status(run))

    app.router.add_post("/staging/commit", commit)
    app.router.add_post("/staging/abort", abort)
    app.router.add_get("/staging/status", status)
