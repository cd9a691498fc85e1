# Minimal stubs: only what replicad uses.
from typing import NamedTuple

class KazooState:
    SUSPENDED: str
    CONNECTED: str
    LOST: str

class KeeperState:
    AUTH_FAILED: str
    CONNECTED: str
    CONNECTED_RO: str
    CONNECTING: str
    CLOSED: str
    EXPIRED_SESSION: str

class EventType:
    CREATED: str
    DELETED: str
    CHANGED: str
    CHILD: str
    NONE: str

class WatchedEvent(NamedTuple):
    type: str
    state: str
    path: str | None

class ZnodeStat(NamedTuple):
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeralOwner: int
    dataLength: int
    numChildren: int
    pzxid: int
