"""The table of ClickHouse setting names replicad knows, with ClickHouse's defaults.

Two families share the config's ``settings:`` map:

* MergeTree / replication settings (``system.merge_tree_settings`` in ClickHouse) — the values below were
  read from a running ClickHouse 18.16.1 server; settings that only modern ClickHouse has carry
  ``since`` and modern defaults;
* the few query/server-level settings that govern inserts and background pools (``system.settings``):
  block sizes, quorum, deduplication, pool sizes.

The same table validates the per-query URL settings of the HTTP API (``SettingScope.QUERY``).
An unknown name is an error (ClickHouse code 115, UNKNOWN_SETTING).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SettingScope(enum.Enum):
    MERGE_TREE = "merge_tree"  # table-level, system.merge_tree_settings
    SERVER = "server"  # read once at start-up (pool sizes, block sizes used by the part writer)
    QUERY = "query"  # may also be given per request in the URL


@dataclass(frozen=True)
class SettingDef:
    name: str
    default: int | float | str
    scope: SettingScope
    description: str
    since: str = "18.16"  # first ClickHouse release with this setting (as far as replicad cares)
    check: Callable[[Any], str | None] | None = None  # extra validation: returns a problem or None

    @property
    def kind(self) -> type:
        return type(self.default)


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _bool01(v: Any) -> str | None:
    return None if v in (0, 1) else "must be 0 or 1"


def _zero_only(v: Any) -> str | None:
    return None if v == 0 else "replicad writes fixed (non-adaptive) granularity as ClickHouse 18.16: only 0"


def _ratio(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


MT = SettingScope.MERGE_TREE
SRV = SettingScope.SERVER
Q = SettingScope.QUERY

_DEFS: tuple[SettingDef, ...] = (
    # --- MergeTree settings, defaults as a ClickHouse 18.16.1 server reports them -----------------------
    SettingDef("index_granularity", 8192, MT, "rows per granule (one mark, one primary.idx entry)",
               check=_positive),
    SettingDef("max_bytes_to_merge_at_max_space_in_pool", 161061273600, MT,
               "largest total size of parts merged when the pool is free", check=_positive),
    SettingDef("max_bytes_to_merge_at_min_space_in_pool", 1048576, MT,
               "largest merge size when the pool is nearly full", check=_positive),
    SettingDef("max_replicated_merges_in_queue", 16, MT, "MERGE_PARTS entries allowed in the queue at once",
               check=_positive),
    SettingDef("number_of_free_entries_in_pool_to_lower_max_size_of_merge", 8, MT,
               "below this many free pool slots, merges are limited to small parts", check=_non_negative),
    SettingDef("old_parts_lifetime", 480, MT, "seconds an outdated part is kept before removal",
               check=_non_negative),
    SettingDef("temporary_directories_lifetime", 86400, MT, "seconds a tmp_* directory stays untouched "
               "(timed on the monotonic clock, not by its file times) before it is removed",
               check=_non_negative),
    SettingDef("parts_to_delay_insert", 150, MT, "partition part count that delays inserts",
               check=_positive),
    SettingDef("parts_to_throw_insert", 300, MT, "partition part count that fails inserts",
               check=_positive),
    SettingDef("max_delay_to_insert", 1, MT, "maximum insert delay in seconds", check=_non_negative),
    SettingDef("replicated_deduplication_window", 100, MT, "block ids kept under blocks/ for deduplication",
               check=_non_negative),
    SettingDef("replicated_deduplication_window_seconds", 604800, MT, "age limit of kept block ids",
               check=_non_negative),
    SettingDef("max_replicated_logs_to_keep", 10000, MT, "log entries kept before cleanup (18.16: 10000)",
               check=_positive),
    SettingDef("min_replicated_logs_to_keep", 100, MT, "log entries always kept (18.16: 100)",
               check=_non_negative),
    SettingDef("prefer_fetch_merged_part_time_threshold", 3600, MT,
               "fetch instead of merge when the log entry is older than this (s)", check=_non_negative),
    SettingDef("prefer_fetch_merged_part_size_threshold", 10737418240, MT,
               "fetch instead of merge when the parts are larger than this", check=_non_negative),
    SettingDef("max_suspicious_broken_parts", 10, MT, "broken parts tolerated at start-up",
               check=_non_negative),
    SettingDef("max_files_to_modify_in_alter_columns", 75, MT, "ALTER file limit", check=_non_negative),
    SettingDef("max_files_to_remove_in_alter_columns", 50, MT, "ALTER file limit", check=_non_negative),
    SettingDef("replicated_max_ratio_of_wrong_parts", 0.5, MT, "wrong parts ratio tolerated at start-up",
               check=_ratio),
    SettingDef("replicated_max_parallel_fetches", 0, MT, "concurrent fetches, all tables (0 = unlimited)",
               check=_non_negative),
    SettingDef("replicated_max_parallel_fetches_for_table", 0, MT, "fetches per table (0 = unlimited)",
               check=_non_negative),
    SettingDef("replicated_max_parallel_fetches_for_host", 15, MT, "concurrent fetches from one host",
               check=_non_negative),
    SettingDef("replicated_max_parallel_sends", 0, MT, "concurrent sends, all tables (0 = unlimited)",
               check=_non_negative),
    SettingDef("replicated_max_parallel_sends_for_table", 0, MT, "concurrent sends per table (0 = unlimited)",
               check=_non_negative),
    SettingDef("replicated_can_become_leader", 1, MT, "take part in leader election", check=_bool01),
    SettingDef("zookeeper_session_expiration_check_period", 60, MT, "seconds between session checks",
               check=_positive),
    SettingDef("check_delay_period", 60, MT, "seconds between replica delay checks", check=_positive),
    SettingDef("cleanup_delay_period", 30, MT, "seconds between cleanup runs", check=_non_negative),
    SettingDef("cleanup_delay_period_random_add", 10, MT, "random extra seconds for cleanup",
               check=_non_negative),
    SettingDef("min_relative_delay_to_yield_leadership", 120, MT, "yield leadership when lagging (s)",
               check=_non_negative),
    SettingDef("min_relative_delay_to_close", 300, MT, "stop serving reads when lagging (s)",
               check=_non_negative),
    SettingDef("min_absolute_delay_to_close", 0, MT, "absolute delay to close (s)",
               check=_non_negative),
    SettingDef("enable_vertical_merge_algorithm", 1, MT, "vertical merges", check=_bool01),
    SettingDef("vertical_merge_algorithm_min_rows_to_activate", 131072, MT, "vertical merge threshold",
               check=_non_negative),
    SettingDef("vertical_merge_algorithm_min_columns_to_activate", 11, MT, "vertical merge threshold",
               check=_non_negative),
    SettingDef("compatibility_allow_sampling_expression_not_in_primary_key", 0, MT, "legacy check",
               check=_bool01),
    SettingDef("use_minimalistic_checksums_in_zookeeper", 1, MT, "checksums format version 5 in ZooKeeper",
               check=_bool01),
    SettingDef("finished_mutations_to_keep", 100, MT, "finished mutations kept in ZooKeeper",
               check=_non_negative),
    SettingDef("min_merge_bytes_to_use_direct_io", 10737418240, MT, "O_DIRECT threshold for merges",
               check=_non_negative),
    # --- MergeTree settings modern ClickHouse added (accepted so configs can be shared) -----------------
    SettingDef("always_fetch_merged_part", 0, MT, "never merge locally, always fetch merged parts",
               since="20.x", check=_bool01),
    SettingDef("index_granularity_bytes", 0, MT, "adaptive granularity (0 = off, as 18.16 writes)",
               since="19.x", check=_zero_only),
    SettingDef("fsync_after_insert", 0, MT, "fsync every file of a part written here (insert, merge, "
               "mutation) before it is committed; 0 = leave it to the page cache, as ClickHouse",
               since="20.x", check=_bool01),
    SettingDef("fsync_part_directory", 0, MT, "fsync the part directory after writing a part and the table "
               "directory after renaming it into place", since="20.x", check=_bool01),
    SettingDef("min_compressed_bytes_to_fsync_after_fetch", 0, MT,
               "fsync a fetched part's files when it has at least this many bytes (0 = never)",
               since="20.x", check=_non_negative),
    SettingDef("use_minimalistic_part_header_in_zookeeper", 0, MT,
               "single-node part header (modern default 1); 18.16 cannot read it", since="19.x",
               check=lambda v: None if v == 0 else "18.16 cannot read single-node part headers: only 0"),
    # --- replicad's own: two-phase (staged) writes --------------------------------------------------------
    SettingDef("replicad_staging_ttl", 86400, MT, "seconds a run's staged parts wait for a commit decision "
               "after its last staged batch before the run is aborted and they are removed", since="replicad",
               check=_positive),
    SettingDef("replicad_staging_record_lifetime", 259200, MT, "seconds a finished run's decision record "
               "stays in ZooKeeper", since="replicad", check=_positive),
    SettingDef("replicad_job_record_lifetime", 2592000, MT, "seconds a committed job id is remembered (a "
               "re-run of it within this time adds nothing), by ZooKeeper's clock", since="replicad",
               check=_positive),
    # --- server-level settings ---------------------------------------------------------------------------
    SettingDef("min_compress_block_size", 65536, SRV, "flush a compressed block at a mark once this many "
               "uncompressed bytes are buffered", check=_positive),
    SettingDef("max_compress_block_size", 1048576, SRV, "largest uncompressed block before compression",
               check=_positive),
    SettingDef("background_pool_size", 16, SRV, "threads for merges and mutations", check=_positive),
    SettingDef("background_schedule_pool_size", 16, SRV, "threads for replication bookkeeping tasks",
               check=_positive),
    SettingDef("background_fetches_pool_size", 16, SRV, "concurrent fetches (ClickHouse 20.x: 8)",
               since="20.x", check=_positive),
    # --- S3 disks and zero-copy replication (ClickHouse 21.x+ names) --------------------------------------
    SettingDef("storage_policy", "default", MT, "the storage policy (config storage.policies) of the table's "
               "parts; 'default' = the local data_path", since="19.15"),
    SettingDef("allow_remote_fs_zero_copy_replication", 0, MT, "replicas sharing an S3 disk share the part "
               "objects (fetch exchanges metadata only; zero-copy locks in ZooKeeper)", since="21.8",
               check=_bool01),
    SettingDef("remote_fs_zero_copy_zookeeper_path", "/clickhouse/zero_copy", MT,
               "root of the zero-copy lock tree", since="21.12",
               check=lambda v: None if str(v).startswith("/") else "must be an absolute ZooKeeper path"),
    SettingDef("remote_fs_orphan_scan_period_s", 0, MT, "seconds between scans of the S3 disk for objects no "
               "lock or local part references (0 = off)", since="replicad", check=_non_negative),
    SettingDef("remote_fs_orphan_scan_grace_s", 3600, MT, "seconds an unreferenced object must have existed "
               "before the orphan scan deletes it (longer than any upload-to-commit)", since="replicad",
               check=_positive),
    # --- query-level settings (also accepted in the HTTP URL) --------------------------------------------
    SettingDef("max_insert_block_size", 1048576, Q, "rows per insert block (one block_id each)",
               check=lambda v: None if 0 < v <= 100_000_000 else "must be in 1..100000000"),
    SettingDef("max_partitions_per_insert_block", 100, Q,
               "partitions one insert block may touch (0 = no limit)",
               check=_non_negative),
    SettingDef("max_query_size", 262144, Q, "bytes of query text parsed (for INSERT: its first line, not the "
               "data)",
               check=lambda v: None if 0 < v <= 16 * 1024 * 1024 else "must be in 1..16777216"),
    SettingDef("max_rows_to_sort", 0, Q, "rows an ORDER BY may hold at once (0 = no limit; code 396 beyond)",
               check=_non_negative),
    SettingDef("max_bytes_to_sort", 1 << 30, Q, "bytes of rows an ORDER BY may hold at once (0 = no limit; "
               "code 396 beyond). ClickHouse's default is 0 with an external sort; replicad sorts in memory, "
               "so it is 1 GiB here", since="replicad", check=_non_negative),
    SettingDef("insert_quorum", 0, Q, "replicas that must hold an insert before it succeeds (0 = off)",
               check=_non_negative),
    SettingDef("insert_quorum_timeout", 600000, Q, "quorum wait in milliseconds", check=_positive),
    SettingDef("insert_deduplicate", 1, Q, "deduplicate insert blocks by block_id", check=_bool01),
    SettingDef("replication_alter_columns_timeout", 60, Q, "seconds ALTER … COLUMN waits for the active "
               "replicas to apply it (code 341 after)", check=_positive),
    SettingDef("distributed_ddl_task_timeout", 180, Q, "seconds an ON CLUSTER statement waits for the hosts "
               "(0: enqueue and return; negative: no limit; code 159 after)"),
    SettingDef("insert_deduplication_token", "", Q, "user-supplied block_id seed", since="22.x"),
    SettingDef("replicad_stage_run", "", Q, "two-phase write: stage this insert for run <hex id> instead of "
               "publishing it", since="replicad"),
    SettingDef("replicad_stage_task", "", Q, "two-phase write: the task attempt staging it",
               since="replicad"),
    SettingDef("replicad_stage_batch", 0, Q, "two-phase write: the request's number within the task (a "
               "retried request with the same number is deduplicated)", since="replicad",
               check=_non_negative),
    SettingDef("mutations_sync", 0, Q, "wait for mutations: 0 no, 1 this replica, 2 all replicas",
               since="19.x", check=lambda v: None if v in (0, 1, 2) else "must be 0, 1 or 2"),
    SettingDef("replication_alter_partitions_sync", 1, Q, "wait for partition operations: 0, 1 or 2",
               check=lambda v: None if v in (0, 1, 2) else "must be 0, 1 or 2"),
    SettingDef("optimize_throw_if_noop", 0, Q, "OPTIMIZE fails if no merge was assigned", check=_bool01),
    SettingDef("input_format_skip_unknown_fields", 0, Q, "ignore unknown JSONEachRow/CSVWithNames fields",
               check=_bool01),
    SettingDef("format_csv_delimiter", ",", Q, "CSV field delimiter (one character)",
               check=lambda v: None if len(v) == 1 else "must be a single character"),
)

SETTINGS: Mapping[str, SettingDef] = {d.name: d for d in _DEFS}

#: URL parameters of ClickHouse's HTTP interface that are not settings (accepted, mostly ignored).
HTTP_PARAMETERS: frozenset[str] = frozenset({
    "query", "database", "default_format", "query_id", "user", "password", "quota_key", "session_id",
    "session_timeout", "session_check", "compress", "decompress", "buffer_size", "wait_end_of_query",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms", "enable_http_compression",
    "add_http_cors_header", "output_format_json_quote_64bit_integers", "date_time_input_format",
    "max_execution_time", "readonly",
    "client_protocol_version",  # clickhouse-connect's probe; replicad answers Native as protocol 0
})


def defaults(scope: SettingScope | None = None) -> dict[str, int | float | str]:
    """Every known setting's ClickHouse default (optionally one scope only)."""
    return {n: d.default for n, d in SETTINGS.items() if scope is None or d.scope is scope}


def coerce(name: str, raw: object) -> tuple[int | float | str | None, str | None]:
    """Convert ``raw`` (YAML value or URL text) to the setting's kind.  Returns (value, problem)."""
    d = SETTINGS.get(name)
    if d is None:
        return None, "unknown setting"
    value: int | float | str
    try:
        if d.kind is str:
            value = str(raw)
        elif isinstance(raw, bool):
            value = d.kind(int(raw))
        elif d.kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                return None, f"expected an integer, got {raw!r}"
            if isinstance(raw, float):
                value = int(raw)
            else:
                text = str(raw).strip().lower()
                value = {"true": 1, "false": 0}[text] if text in ("true", "false") else int(text)
        else:
            value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        return None, f"expected {'an integer' if d.kind is int else d.kind.__name__}, got {raw!r}"
    if d.check is not None:
        problem = d.check(value)
        if problem:
            return None, f"{problem} (got {value!r})"
    return value, None


def validate(values: Mapping[str, object]) -> tuple[dict[str, int | float | str], list[str]]:
    """Coerce a whole settings map.  Returns (defaults updated with the valid values, problems as
    ``"<name>: <problem>"``)."""
    out = defaults()
    problems: list[str] = []
    for name, raw in values.items():
        value, problem = coerce(name, raw)
        if problem is not None:
            problems.append(f"{name}: {problem}")
        elif value is not None:
            out[name] = value
    if not problems and out["parts_to_delay_insert"] > out["parts_to_throw_insert"]:  # type: ignore[operator]
        problems.append("parts_to_delay_insert: must not exceed parts_to_throw_insert")
    if not problems and out["min_replicated_logs_to_keep"] > out["max_replicated_logs_to_keep"]:  # type: ignore[operator]
        problems.append("min_replicated_logs_to_keep: must not exceed max_replicated_logs_to_keep")
    return out, problems
