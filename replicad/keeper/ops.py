"""Operations of a ZooKeeper multi-transaction, as plain records (no kazoo types).

``Keeper.multi([Create(...), Set(...), Delete(...), Check(...)])`` runs them atomically.
Results, one per op: ``Create`` → the created path (with the sequence suffix, relative to the
client's chroot), ``Set`` → the new ``ZnodeStat``, ``Delete`` / ``Check`` → ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass


def _check_path(path: str) -> None:
    if not path.startswith("/"):
        raise ValueError(f"ZooKeeper path must be absolute: {path!r}")


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False

    def __post_init__(self) -> None:
        _check_path(self.path)
        if not isinstance(self.data, bytes):
            raise TypeError(f"znode data must be bytes, got {type(self.data).__name__}")


@dataclass(frozen=True, slots=True)
class Set:
    path: str
    data: bytes
    version: int = -1

    def __post_init__(self) -> None:
        _check_path(self.path)
        if not isinstance(self.data, bytes):
            raise TypeError(f"znode data must be bytes, got {type(self.data).__name__}")


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
