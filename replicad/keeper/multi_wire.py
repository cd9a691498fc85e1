"""A multi's request packed straight from replicad's ops (the bytes kazoo's ``TransactionRequest`` makes).

kazoo builds a multi as one request object per op (its path checked, normalized and prefixed with the chroot
by three helper functions), then serializes each op and its header into a new buffer: 100 µs of Python for the
commit's seven ops on an idle machine (cProfile of ``Keeper.send_multi``), on the loop or on the part writer's
thread, both of which the insert is waiting for.  Here each op is packed in one ``struct`` call from the path
and data it already has; the answer is read by kazoo's own ``Transaction.deserialize``.  Paths that need
kazoo's normalization (a ``//``, a trailing ``/``, a ``.`` component) go through kazoo's helper, as does
the sequential child ``<dir>/`` (named by the bare sequence number, see ``Keeper``'s sequential creates).
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Sequence
from typing import Any

from kazoo.protocol.serialization import Transaction

from replicad.keeper.ops import Check, Create, Delete, Op, Set

_paths: Any = importlib.import_module("kazoo.protocol.paths")

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!iBi")  # op type, done, error: kazoo's MultiHeader
#: OPEN_ACL_UNSAFE (kazoo's default ACL): one entry, all permissions, world:anyone
_OPEN_ACL = _INT.pack(1) + _INT.pack(31) + _INT.pack(5) + b"world" + _INT.pack(6) + b"anyone"
_END = _HEADER.pack(-1, 1, -1)
_CREATE, _DELETE, _SET, _CHECK = 1, 2, 5, 13


class PackedTransaction(Transaction):
    """kazoo's multi request whose ``operations`` field holds the packed ops (see :func:`pack_multi`)."""

    __slots__ = ()

    def serialize(self) -> bytes:
        body: bytes = self.operations
        return body


def chroot_prefix(chroot: str | None) -> str:
    """What a chroot puts before every path ("" for none)."""
    root: str = _paths._norm_root(chroot or "")
    return "" if root == "/" else root


def _full_path(prefix: str, path: str, trailing: bool) -> bytes:
    if path.startswith("/") and "//" not in path and "/." not in path and not path.endswith("/"):
        return (prefix + path).encode()
    full: str = _paths._prefix_root(prefix, path, trailing=trailing)
    return full.encode()


def _string(b: bytes) -> bytes:
    return _INT.pack(len(b)) + b


def pack_multi(ops: Sequence[Op], prefix: str) -> bytes:
    """A multi's ops as kazoo's ``Transaction.serialize`` writes them; ``prefix``: :func:`chroot_prefix`."""
    out: list[bytes] = []
    for op in ops:
        if isinstance(op, Create):
            trailing = op.sequence and op.path.endswith("/")
            flags = (1 if op.ephemeral else 0) | (2 if op.sequence else 0)
            out += (_HEADER.pack(_CREATE, 0, -1), _string(_full_path(prefix, op.path, trailing)),
                    _string(op.data), _OPEN_ACL, _INT.pack(flags))
        elif isinstance(op, Set):
            out += (_HEADER.pack(_SET, 0, -1), _string(_full_path(prefix, op.path, False)), _string(op.data),
                    _INT.pack(op.version))
        elif isinstance(op, Delete):
            out += (_HEADER.pack(_DELETE, 0, -1), _string(_full_path(prefix, op.path, False)),
                    _INT.pack(op.version))
        elif isinstance(op, Check):
            out += (_HEADER.pack(_CHECK, 0, -1), _string(_full_path(prefix, op.path, False)),
                    _INT.pack(op.version))
        else:
            raise TypeError(f"not a keeper op: {op!r}")
    out.append(_END)
    return b"".join(out)
