"""Query-level settings of an HTTP request (the URL's ClickHouse settings, an INSERT's), and its query id."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Any

from replicad import settings as settings_table
from replicad.config import Config
from replicad.errors import BadInputError, UnknownSettingError
from replicad.model.staged_job import StageId
from replicad.service import InsertSettings


def url_settings(params: Mapping[str, str]) -> dict[str, int | float | str]:
    """Query-level settings given in the URL; unknown names → UnknownSettingError (code 115)."""
    out: dict[str, int | float | str] = {}
    for name, raw in params.items():
        if name in settings_table.HTTP_PARAMETERS or name.startswith("param_"):
            continue
        d = settings_table.SETTINGS.get(name)
        if d is None or d.scope is not settings_table.SettingScope.QUERY:
            raise UnknownSettingError(f"Unknown setting {name}")
        value, problem = settings_table.coerce(name, raw)
        if problem or value is None:
            raise BadInputError(f"Cannot parse setting {name}: {problem}", code=26)
        out[name] = value
    return out


def query_setting(config: Config, given: Mapping[str, Any], name: str) -> Any:
    """A query-level setting's value for one request: the URL's (``given``), else the config's ``settings:``,
    else ClickHouse's default."""
    return given[name] if name in given else config.setting(name)


def insert_settings(config: Config, given: Mapping[str, int | float | str], query_id: str) -> InsertSettings:
    def get(name: str) -> Any:
        return query_setting(config, given, name)

    token = get("insert_deduplication_token")
    stage = None
    if given.get("replicad_stage_run") or given.get("replicad_stage_task"):
        stage = StageId(str(given.get("replicad_stage_run", "")), str(given.get("replicad_stage_task", "")),
                        int(given.get("replicad_stage_batch", 0)))
    return InsertSettings(
        insert_quorum=int(get("insert_quorum")),
        insert_quorum_timeout_ms=int(get("insert_quorum_timeout")),
        insert_deduplicate=bool(int(get("insert_deduplicate"))),
        insert_deduplication_token=str(token) if token else None,
        max_insert_block_size=int(get("max_insert_block_size")),
        max_partitions_per_insert_block=int(get("max_partitions_per_insert_block")),
        query_id=query_id,
        stage=stage,
    )


# ---- reading the query ---------------------------------------------------------------------------------


#: fresh query ids, version-4 UUIDs from a generator seeded once (uuid4() reads os.urandom per id: a system
#: call that lets go of the GIL on the loop, and another thread may keep it for up to a switch interval)
_QUERY_IDS = random.Random()


def request_query_id(given: str | None) -> str:
    """The client's ``query_id`` (echoed in ``X-ClickHouse-Query-Id``), or a fresh one.  Checked before
    anything is done: a control character would break the answer's headers after an insert committed."""
    if not given:
        return str(uuid.UUID(int=_QUERY_IDS.getrandbits(128), version=4))
    if len(given) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in given):
        raise BadInputError("Invalid query_id: at most 256 characters, no control characters", code=36)
    return given
