"""A part being received against its limits: the size its sender declares against
``interserver.max_fetch_part_bytes``, the files against that declaration, and the disk's free space
(a reading of the last second serves a part that needs a small share of it)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from replicad.errors import CorruptedDataError, NotEnoughSpaceError

__all__ = ["FREE_SPACE_REUSE_S", "FREE_SPACE_SHARE", "SPACE_CHECK_STEP", "SpaceGuard"]

SPACE_CHECK_STEP = 16 << 20  # without a declared size (v0), free space is checked again every this many bytes

#: directory -> (when, free bytes) of its last free-space reading
_RECENT_FREE: dict[Path, tuple[float, int]] = {}
FREE_SPACE_REUSE_S = 1.0
FREE_SPACE_SHARE = 1024  # a reading is reused for a need of at most 1/1024 of the free bytes it saw


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


class SpaceGuard:
    """The received part's declared bytes against its limits and the disk's free space."""

    def __init__(self, directory: Path, max_part_bytes: int) -> None:
        self.directory = directory
        self.max_part_bytes = max_part_bytes
        self.total = 0  # file sizes declared so far (each file is whole on disk before the next is declared)
        self._checked: int | None = None  # ``total`` at the last free-space check

    async def part_declared(self, sum_size: int) -> None:
        """The sender declared the part's size (v>=1): it must fit, whole."""
        need = self._part(sum_size)
        if need is not None:
            self._judge(need, await asyncio.to_thread(_free_bytes, self.directory))

    def part_declared_now(self, sum_size: int) -> None:
        """(blocking) :meth:`part_declared`, for a worker thread."""
        need = self._part(sum_size)
        if need is not None:
            self._judge(need, _free_bytes(self.directory))

    async def file_declared(self, size: int, sum_size: int | None) -> None:
        """A file of ``size`` bytes comes next."""
        need = self._file(size, sum_size)
        if need is not None:
            self._judge(need, await asyncio.to_thread(_free_bytes, self.directory))

    def file_declared_now(self, size: int, sum_size: int | None) -> None:
        """(blocking) :meth:`file_declared`, for a worker thread."""
        need = self._file(size, sum_size)
        if need is not None:
            self._judge(need, _free_bytes(self.directory))

    def _part(self, sum_size: int) -> int | None:
        self._check_limit(sum_size)
        self._checked = 0
        return self._reading_needed(sum_size)

    def _file(self, size: int, sum_size: int | None) -> int | None:
        self.total += size
        if sum_size is not None and self.total > sum_size:
            raise CorruptedDataError(f"The part's files add up to more than the {sum_size} bytes the sender "
                                     "declared for it")
        self._check_limit(self.total)
        if sum_size is None and (self._checked is None or self.total - self._checked >= SPACE_CHECK_STEP
                                 or size >= SPACE_CHECK_STEP):
            self._checked = self.total
            return self._reading_needed(size)
        return None

    def _check_limit(self, total: int) -> None:
        if total > self.max_part_bytes:
            raise CorruptedDataError(f"The part is larger than {self.max_part_bytes} bytes "
                                     "(interserver.max_fetch_part_bytes)")

    def _reading_needed(self, need: int) -> int | None:
        """``need`` when the free space must be read for it, None when a reading of the last second serves
        (a part that needs a small share of it: a backlog of small parts made one thread trip per part)."""
        seen = _RECENT_FREE.get(self.directory)
        if seen is not None and time.monotonic() - seen[0] < FREE_SPACE_REUSE_S \
                and need * FREE_SPACE_SHARE <= seen[1]:
            return None
        return need

    def _judge(self, need: int, free: int) -> None:
        if len(_RECENT_FREE) > 1000:
            _RECENT_FREE.clear()
        _RECENT_FREE[self.directory] = (time.monotonic(), free)
        if need > free:
            raise NotEnoughSpaceError(f"Cannot fetch part: {need} more bytes are needed, the disk has {free} "
                                      "bytes free")
