"""HTTP to replicad from Spark's driver and executors (urllib only: nothing to install on executors).

:func:`request` retries transient failures (connection errors, timeouts, 429/502/503/504 and retriable
ClickHouse codes) with exponential backoff honouring ``Retry-After``; any other error answer raises
:class:`ReplicadSparkError` carrying the server's message.
"""

from __future__ import annotations

import json
import logging
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import IO, Any

log = logging.getLogger("replicad.spark")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# ClickHouse codes worth re-sending under the same identity: UNKNOWN_STATUS_OF_INSERT, KEEPER_EXCEPTION,
# TABLE_IS_READ_ONLY, TOO_MANY_PARTS.
RETRY_CODES = frozenset({"319", "999", "242", "252"})
MAX_BACKOFF_S = 30.0
OCTETS = "application/octet-stream"


class ReplicadSparkError(RuntimeError):
    """A request the server refused (or that kept failing); the message carries the server's answer."""


def query_url(base: str, query: str, settings: Iterable[tuple[str, str]] = ()) -> str:
    return f"{base}/?" + urllib.parse.urlencode([("query", query), *settings])


def auth_headers(user: str | None, password: str | None) -> dict[str, str]:
    """ClickHouse's header credentials (never in the URL, where logs would keep them)."""
    if not user:
        return {}
    return {"X-ClickHouse-User": user, "X-ClickHouse-Key": password or ""}


def _retry_after(headers: Any) -> float | None:
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def open_url(url: str, body: bytes | None, *, timeout_s: float, retries: int, what: str,
             headers: Mapping[str, str] | None = None, content_type: str = OCTETS) -> IO[bytes]:
    """POST ``body`` (GET when None) with retries; the open response (a file to stream from)."""
    attempt = 0
    while True:
        req = urllib.request.Request(url, data=body, method="GET" if body is None else "POST")
        if body is not None:
            req.add_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        wait: float | None = None
        try:
            resp: IO[bytes] = urllib.request.urlopen(req, timeout=timeout_s)
            return resp
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace").strip()
            code = e.headers.get("X-ClickHouse-Exception-Code", "") if e.headers is not None else ""
            transient = e.code in RETRY_STATUSES or (e.code >= 500 and code in RETRY_CODES)
            if not transient or attempt >= retries:
                raise ReplicadSparkError(f"{what}: HTTP {e.code}: {text}") from None
            wait = _retry_after(e.headers)
            reason = f"HTTP {e.code}: {text[:200]}"
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            if attempt >= retries:
                raise ReplicadSparkError(f"{what}: {type(e).__name__}: {e} (after {attempt} retries)") from e
            reason = f"{type(e).__name__}: {e}"
        attempt += 1
        if wait is None:
            wait = min(MAX_BACKOFF_S, 0.25 * 2 ** attempt) * (0.5 + random.random() / 2)
        log.warning("replicad request %s failed (%s); retry %d/%d in %.1fs", what, reason, attempt, retries,
                    wait)
        time.sleep(min(wait, 2 * MAX_BACKOFF_S))


def request(url: str, body: bytes | None, *, timeout_s: float, retries: int, what: str,
            headers: Mapping[str, str] | None = None, content_type: str = OCTETS) -> bytes:
    """Like :func:`open_url`, returning the whole answer body."""
    with open_url(url, body, timeout_s=timeout_s, retries=retries, what=what, headers=headers,
                  content_type=content_type) as resp:
        return bytes(resp.read())


def post_json(url: str, obj: Mapping[str, Any], *, timeout_s: float, retries: int, what: str,
              headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    raw = request(url, json.dumps(obj).encode(), timeout_s=timeout_s, retries=retries, what=what,
                  headers=headers, content_type="application/json")
    out = json.loads(raw or b"{}")
    if not isinstance(out, dict):
        raise ReplicadSparkError(f"{what}: unexpected answer {raw[:200]!r}")
    return out


def get_json(url: str, *, timeout_s: float, retries: int, what: str,
             headers: Mapping[str, str] | None = None) -> Any:
    return json.loads(request(url, None, timeout_s=timeout_s, retries=retries, what=what, headers=headers))
