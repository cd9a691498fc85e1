"""What an INSERT reads: its input columns and the parser's settings and limits (:class:`InputSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replicad.config import Config
from replicad.errors import BadInputError
from replicad.server.input_columns import InputSpec
from replicad.server.routing import InsertRoute
from replicad.server.sync_body import ParsePool
from replicad.service import TableService

ILLEGAL_COLUMN = 44
NO_SUCH_COLUMN = 16


def input_spec(cfg: Config, table: TableService, r: InsertRoute, block_rows: int,
               given: Mapping[str, Any], pool: ParsePool | None, spool: str | None = None) -> InputSpec:
    """The parser's settings for one INSERT (URL settings ``given``), its limits from ``api.*``; file bodies
    (Parquet, Arrow) are spooled under ``spool`` (made once by :func:`spool_dir`)."""
    return InputSpec(
        format=r.format, columns=insert_columns(table, r.columns),
        explicit_columns=r.columns is not None,
        block_rows=block_rows, tz=cfg.timezone,
        skip_unknown_fields=bool(int(given.get("input_format_skip_unknown_fields", 0))),
        csv_delimiter=str(given.get("format_csv_delimiter", ",")), spool_dir=spool,
        receive_timeout_s=cfg.api.receive_timeout_s, max_line_bytes=cfg.api.max_line_bytes,
        executor=pool.executor if pool is not None else None)


def spool_dir(path: Path) -> str | None:
    """``path`` made if missing (blocking: called once, off the loop, when the API starts); None when it
    cannot be made (the system's temporary directory is used then)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(path)


def _materialized_columns(table: TableService) -> set[str]:
    """The table's MATERIALIZED columns (from the sink schema's ``defaults``, when the engine has one)."""
    defaults = getattr(getattr(table, "schema", None), "defaults", ()) or ()
    return {c for c, kind, _e in defaults if str(kind).upper() == "MATERIALIZED"}


def insert_columns(table: TableService, names: tuple[str, ...] | None) -> list[tuple[str, Any]]:
    """The INSERT's input columns: the named ones, or every column but the MATERIALIZED ones (ClickHouse's
    ``getSampleBlockNonMaterialized``); naming a MATERIALIZED column is refused as 18.16 refuses it."""
    materialized = _materialized_columns(table)
    cols = [(n, t) for n, t in table.columns if n not in materialized]
    if names is None:
        return cols
    types = dict(cols)
    out, seen = [], set()
    for n in names:
        if n in materialized:
            raise BadInputError(f"Cannot insert column {n}, because it is MATERIALIZED column.",
                                code=ILLEGAL_COLUMN)
        if n not in types:
            raise BadInputError(f"No such column {n} in table {table.name}", code=NO_SUCH_COLUMN)
        if n in seen:
            raise BadInputError(f"Column {n} is listed twice in the INSERT", code=15)
        seen.add(n)
        out.append((n, types[n]))
    return out
