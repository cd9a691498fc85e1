"""Options of the ``replicad`` data source (keys are case-insensitive, as Spark passes them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replicad.spark.http import auth_headers

DEFAULT_URL = "http://127.0.0.1:8123"
DEFAULT_BATCH_SIZE = 100_000
TWO_PHASE = "two_phase"
BATCH_TOKENS = "batch_tokens"
#: test hooks (fault injection from the test suite): fail once, or pause the driver's commit
TEST_HOOKS = ("fail_after_batches_once", "fail_after_last_batch_once", "fail_marker", "pause_before_decision",
              "pause_after_decision")


@dataclass(frozen=True)
class WriteOptions:
    url: str
    table: str
    batch_size: int = DEFAULT_BATCH_SIZE
    timeout_s: float = 300.0
    retries: int = 5
    settings: tuple[tuple[str, str], ...] = ()  # extra URL settings (insert_quorum, …)
    mode: str = TWO_PHASE
    job_id: str | None = None  # None: a fresh id per job (a re-run writes again)
    commit_url: str = ""  # where the driver commits (default: url)
    publish_timeout_s: float = 600.0
    user: str | None = None
    password: str | None = None
    hooks: tuple[tuple[str, str], ...] = ()

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.user, self.password)

    def hook(self, name: str) -> str | None:
        return dict(self.hooks).get(name)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Validate the data source options; ValueError lists every problem."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        problems: list[str] = []

        def number(key: str, default: float, kind: type = int, minimum: float = 0) -> Any:
            raw = opts.get(key)
            if raw is None or raw == "":
                return default
            try:
                value = kind(raw)
            except ValueError:
                problems.append(f"option {key}: not a number: {raw!r}")
                return default
            if value < minimum:
                problems.append(f"option {key}: must be >= {minimum}, got {raw}")
            return value

        table = opts.get("table", "").strip()
        if not table:
            problems.append("option table: required (e.g. db.events)")
        url = opts.get("url", DEFAULT_URL).rstrip("/")
        commit_url = opts.get("commit_url", url).rstrip("/")
        for key, value in (("url", url), ("commit_url", commit_url)):
            if not value.startswith(("http://", "https://")):
                problems.append(f"option {key}: must be an http(s) URL, got {value!r}")
        settings: list[tuple[str, str]] = []
        for key in ("insert_quorum", "insert_quorum_timeout", "insert_deduplicate"):
            if opts.get(key):
                settings.append((key, opts[key]))
        settings += sorted((k.split(".", 1)[1], v) for k, v in opts.items()
                           if k.startswith(("setting.", "settings.")) and "." in k)
        for name, _v in settings:
            if name == "insert_deduplication_token" or name.startswith("replicad_stage_"):
                problems.append(f"option setting.{name}: the writer sets it itself")
        mode = opts.get("write_mode", TWO_PHASE)
        if mode not in (TWO_PHASE, BATCH_TOKENS):
            problems.append(f"option write_mode: {TWO_PHASE} or {BATCH_TOKENS}, got {mode!r}")
        if mode == TWO_PHASE and any(k == "insert_quorum" and v not in ("0", "1") for k, v in settings):
            problems.append("option insert_quorum: not available with write_mode=two_phase")
        job_id = opts.get("job_id") or None
        if job_id is not None and len(job_id) > 512:
            problems.append("option job_id: at most 512 characters")
        hooks = tuple((k, opts[k]) for k in TEST_HOOKS if opts.get(k))
        if any(k.startswith("fail_after") for k, _ in hooks) and "fail_marker" not in dict(hooks):
            problems.append("option fail_after_batches_once needs option fail_marker (a file path)")
        parsed = cls(url=url, table=table, batch_size=number("batch_size", DEFAULT_BATCH_SIZE, int, 1),
                     timeout_s=number("timeout", 300.0, float, 0.001), retries=number("retries", 5, int, 0),
                     settings=tuple(settings), mode=mode, job_id=job_id, commit_url=commit_url,
                     publish_timeout_s=number("publish_timeout", 600.0, float, 0),
                     user=opts.get("user") or None, password=opts.get("password"), hooks=hooks)
        if problems:
            raise ValueError("replicad data source: " + "; ".join(problems))
        return parsed


@dataclass(frozen=True)
class ReadOptions:
    url: str
    table: str
    timeout_s: float
    retries: int
    strings_as_binary: bool
    columns: tuple[str, ...] | None
    split_by_partition: bool
    user: str | None = None
    password: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.user, self.password)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        w = WriteOptions.parse(options)
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        flag = opts.get("strings_as_binary", "false").lower() in ("1", "true", "yes")
        listed = [c.strip() for c in opts.get("columns", "").split(",") if c.strip()]
        cols = tuple(listed) if listed else None
        split = opts.get("split_by_partition", "true").lower() in ("1", "true", "yes")
        return cls(w.url, w.table, w.timeout_s, w.retries, flag, cols, split, w.user, w.password)
