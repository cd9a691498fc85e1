"""A ``select()`` for kazoo's connection thread built on poll(2).

kazoo's threading handler waits with a helper that creates, fills and closes a new epoll selector on every
call; its connection thread waits before each read and each send, so every ZooKeeper answer cost about
three ``epoll_create1`` + ``epoll_ctl`` + ``close`` system calls (measured with strace: 313 epoll instances
for three small inserts on a replicating replica).  A ``select.poll`` object lives in user space (one
``poll`` system call per wait) and, unlike ``select.select``, has no limit on descriptor numbers.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Protocol, TypeVar


class HasFileno(Protocol):
    def fileno(self) -> int: ...


F = TypeVar("F", bound=HasFileno | int)

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT
#: an error or hang-up wakes both readers and writers: their next recv/send reports it
_TROUBLE = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _fd(obj: HasFileno | int) -> int:
    fd = obj if isinstance(obj, int) else obj.fileno()
    if fd < 0:
        raise TypeError(f"Invalid file descriptor: {fd}")
    return fd


def poll_select(
    rlist: Sequence[F], wlist: Sequence[F], xlist: Sequence[F], timeout: float | None = None
) -> tuple[list[F], list[F], list[F]]:
    """``select.select`` semantics (objects with ``fileno()`` or descriptors; ``timeout`` in seconds, None =
    wait for ever); ``xlist`` is accepted and never reported (kazoo passes it empty)."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    masks: dict[int, int] = {}
    for obj in rlist:
        fd = _fd(obj)
        masks[fd] = masks.get(fd, 0) | _READ
    for obj in wlist:
        fd = _fd(obj)
        masks[fd] = masks.get(fd, 0) | _WRITE
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
    if not ready:
        return [], [], []
    readable = [obj for obj in rlist if ready.get(_fd(obj), 0) & (_READ | _TROUBLE)]
    writable = [obj for obj in wlist if ready.get(_fd(obj), 0) & (_WRITE | _TROUBLE)]
    return readable, writable, []
