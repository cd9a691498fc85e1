"""The workload: concurrent clients inserting uniquely tagged rows, and an admin client running merges,
mutations and DROP PARTITION, all through the HTTP API; every operation goes into the history.

Rows are ``(p, id, client, v)``: ``id`` is unique over the whole run (``client * 10**6 + batch * ROWS + j``),
``v = id`` at insert time.  Partitions 0..3 hold the rows whose loss the checker looks for; rows in 8 are the
target of ``ALTER DELETE WHERE p = 8`` and partition 9 is dropped now and then, so those two are only checked
for duplicates.  An insert whose outcome is unknown (timeout, reset, refused, 5xx) is retried — on a replica
picked at random, with the same ``insert_deduplication_token`` — until one attempt answers 200 (acked) or its
time runs out (indeterminate: the rows may or may not be there).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROWS = 5
CHECKED_PARTITIONS = (0, 1, 2, 3)
DELETED_PARTITION = 8
DROPPED_PARTITION = 9
TABLE = "db.t"


def http_query(url: str, sql: str, body: bytes | None = None, timeout: float = 5.0,
               **params: object) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); raises OSError (and http.client errors) when there is no answer."""
    parsed = urllib.parse.urlsplit(url)
    path = "/?" + urllib.parse.urlencode({"query": sql, **{k: str(v) for k, v in params.items()}})
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)
    try:
        conn.request("POST", path, body=body if body is not None else b"")
        resp = conn.getresponse()
        return resp.status, {k: v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@dataclass
class InsertOp:
    client: int
    batch: int
    partition: int
    quorum: int
    ids: list[int]
    token: str
    status: str = "pending"  # acked | indeterminate
    deduplicated: bool = False  # the acking answer said the block was a duplicate
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    acked_by: str = ""
    quorum_probe: str = ""  # quorum 2: "ok", "unverified" or a description of the violation


@dataclass
class AdminOp:
    sql: str
    replica: str
    outcome: str


class Clients:
    """``n`` insert clients and one admin client, running until :meth:`stop`."""

    def __init__(self, urls: dict[str, str], seed: int, n: int = 3, quorum2_share: float = 0.3,
                 admin: bool = True, op_deadline_s: float = 30.0, pause_s: float = 0.15,
                 quorum_probe: Callable[[InsertOp], str] | None = None, tokens: bool = True) -> None:
        """``tokens``: send ``insert_deduplication_token`` (False in the mixed variant: 18.16 does not know
        it, so every replica deduplicates retries by the block's hash)."""
        self.urls = urls
        self.seed = seed
        self.n = n
        self.quorum2_share = quorum2_share
        self.op_deadline_s = op_deadline_s
        self.pause_s = pause_s
        self.quorum_probe = quorum_probe
        self.tokens = tokens
        self.inserts: list[InsertOp] = []
        self.admin_ops: list[AdminOp] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(c,), daemon=True) for c in range(n)]
        if admin:
            self.threads.append(threading.Thread(target=self._admin, daemon=True))

    def start(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout)

    # ---- inserts

    def insert_one(self, op: InsertOp, rng: random.Random, replicas: Sequence[str] | None = None) -> InsertOp:
        body = "".join(f"{op.partition}\t{i}\t{op.client}\t{i}\n" for i in op.ids).encode()
        names = list(replicas or self.urls)
        deadline = time.monotonic() + self.op_deadline_s
        while time.monotonic() < deadline:
            name = rng.choice(names)
            op.attempts += 1
            params: dict[str, object] = {"insert_quorum": op.quorum, "insert_quorum_timeout": 10000}
            if self.tokens:
                params["insert_deduplication_token"] = op.token
            try:
                status, headers, text = http_query(
                    self.urls[name], f"INSERT INTO {TABLE} FORMAT TabSeparated", body, timeout=8.0, **params)
            except (OSError, http.client.HTTPException) as e:
                op.errors.append(f"{name}: {type(e).__name__}")
                time.sleep(0.2)
                continue
            if status == 200:
                op.status, op.acked_by = "acked", name
                summary = json.loads(headers.get("X-ClickHouse-Summary", "{}") or "{}")
                op.deduplicated = bool(summary) and str(summary.get("written_rows", "1")) == "0"
                if op.quorum > 1 and self.quorum_probe is not None:
                    op.quorum_probe = self.quorum_probe(op)
                return op
            op.errors.append(f"{name}: HTTP {status} {text[:120].decode('utf-8', 'replace')}")
            time.sleep(0.3)
        op.status = "indeterminate"
        return op

    def _client(self, c: int) -> None:
        rng = random.Random(self.seed * 1000 + c)
        k = 0
        while not self._stop.is_set():
            r = rng.random()
            partition = (DROPPED_PARTITION if r < 0.08 else DELETED_PARTITION if r < 0.14
                         else rng.choice(CHECKED_PARTITIONS))
            quorum = 2 if rng.random() < self.quorum2_share else 1
            ids = [c * 10**6 + k * ROWS + j for j in range(ROWS)]
            op = InsertOp(c, k, partition, quorum, ids, f"s{self.seed}-c{c}-b{k}")
            with self._lock:
                self.inserts.append(op)
            self.insert_one(op, rng)
            k += 1
            self._stop.wait(self.pause_s)

    # ---- merges, mutations, DROP PARTITION

    def _admin(self) -> None:
        rng = random.Random(self.seed * 1000 + 999)
        statements = [
            lambda: f"OPTIMIZE TABLE {TABLE} PARTITION {rng.choice(CHECKED_PARTITIONS)}",
            lambda: f"OPTIMIZE TABLE {TABLE} PARTITION {rng.choice(CHECKED_PARTITIONS)} FINAL",
            lambda: f"ALTER TABLE {TABLE} UPDATE v = v + 1 WHERE id % 7 = {rng.randrange(7)}",
            lambda: f"ALTER TABLE {TABLE} DELETE WHERE p = {DELETED_PARTITION}",
            lambda: f"ALTER TABLE {TABLE} DROP PARTITION {DROPPED_PARTITION}",
        ]
        while not self._stop.wait(rng.uniform(1.0, 2.5)):
            sql = rng.choice(statements)()
            name = rng.choice(list(self.urls))
            try:
                status, _h, text = http_query(self.urls[name], sql, timeout=10.0)
                outcome = "ok" if status == 200 else f"HTTP {status}: {text[:100].decode('utf-8', 'replace')}"
            except (OSError, http.client.HTTPException) as e:
                outcome = type(e).__name__
            with self._lock:
                self.admin_ops.append(AdminOp(sql, name, outcome))
