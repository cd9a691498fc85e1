"""Handing memory that a big request used back to the operating system.

Arrow's allocator (mimalloc) and glibc's malloc keep freed memory mapped for reuse, so after an insert of a
few hundred MB the daemon would go on holding it (RSS +1.9 GB after a 718 MB TSV insert in the benchmark).
Returned at once, those pages are the ones the kernel hands out next — to the page cache of the part files
being written or fetched — instead of pages the machine has not touched yet (on a virtual machine whose memory
the host backs lazily, a first touch costs a hypervisor fault: 0.86 GB/s against 11.5 GB/s for reused pages,
measured here; receiving a 527 MB part then took 3-4x the kernel CPU).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import pyarrow as pa

#: requests whose body reached this size return their memory when they end
RELEASE_AFTER_BYTES = 64 << 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


def release_unused_memory() -> None:
    """Return freed memory of Arrow's pool and of malloc to the system (blocking: call it in a thread)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
