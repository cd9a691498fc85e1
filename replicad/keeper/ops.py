"""Records of the keeper API (no kazoo types): multi-transaction ops, their results, node stats,
watch events and session states.

``Keeper.multi([Create(...), Set(...), Delete(...), Check(...)])`` runs them atomically.
Results, one per op: ``Create`` → the created path (with the sequence suffix, relative to the
client's chroot), ``Set`` → the new ``ZnodeStat``, ``Delete`` / ``Check`` → ``None``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from replicad.errors import KeeperError


def _check_path(path: str, data: object = b"") -> None:
    """An absolute path (ValueError otherwise) and, for ops that write, bytes (TypeError otherwise)."""
    if not path.startswith("/"):
        raise ValueError(f"ZooKeeper path must be absolute: {path!r}")
    if not isinstance(data, bytes):
        raise TypeError(f"znode data must be bytes, got {type(data).__name__}")


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False

    def __post_init__(self) -> None:
        _check_path(self.path, self.data)


@dataclass(frozen=True, slots=True)
class Set:
    path: str
    data: bytes
    version: int = -1

    def __post_init__(self) -> None:
        _check_path(self.path, self.data)


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: int = -1

    def __post_init__(self) -> None:
        _check_path(self.path)


@dataclass(frozen=True, slots=True)
class Check:
    """Fails the transaction unless ``path`` exists with exactly ``version``."""

    path: str
    version: int

    def __post_init__(self) -> None:
        _check_path(self.path)


Op = Create | Set | Delete | Check


class SessionState(enum.StrEnum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class WatchEventType(enum.StrEnum):
    CREATED = "CREATED"
    DELETED = "DELETED"
    CHANGED = "CHANGED"
    CHILD = "CHILD"
    NONE = "NONE"  # the connection dropped: the watch is gone (it was not triggered by a change)


@dataclass(frozen=True, slots=True)
class ZnodeStat:
    czxid: int
    mzxid: int
    ctime_ms: int
    mtime_ms: int
    version: int
    cversion: int
    aversion: int
    ephemeral_owner: int
    data_length: int
    num_children: int
    pzxid: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: WatchEventType
    path: str | None
    keeper_state: str  # kazoo's low-level state at the time, e.g. "CONNECTED", "CONNECTING"


MultiResult = str | ZnodeStat | None
WatchCallback = Callable[[WatchEvent], object]
StateCallback = Callable[[SessionState], object]


@dataclass(frozen=True, slots=True)
class MultiOutcome:
    """``try_multi``'s answer: results on success, else the failing op and its error."""

    results: list[MultiResult]
    failed_index: int | None = None
    error: KeeperError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def zk_code(self) -> int:
        return 0 if self.error is None else int(getattr(self.error, "zk_code", -1))
