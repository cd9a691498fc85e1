"""Handing memory that a big request used back to the operating system.

Arrow's allocator (mimalloc) and glibc's malloc keep freed memory mapped for reuse, so after an insert of a
few hundred MB the daemon would go on holding it (RSS +1.9 GB after a 718 MB TSV insert in the benchmark).
Returned at once, those pages are the ones the kernel hands out next — to the page cache of the part files
being written or fetched — instead of pages the machine has not touched yet (on a virtual machine whose memory
the host backs lazily, a first touch costs a hypervisor fault: 0.86 GB/s against 11.5 GB/s for reused pages,
measured here; receiving a 527 MB part then took 3-4x the kernel CPU).

:func:`keep_out`: pyarrow imports pandas, when installed, the first time it checks whether an argument
is a DataFrame (``pa.table(dict)``, ``pa.array(list)`` ...); the daemon never uses pandas, which made about
35-55 MiB of its resident set (rich and pygments, which structlog imports, 3 MiB more).

:func:`tune_allocators`: Arrow's mimalloc keeps the pages a thread freed until that same thread collects
(``release_unused`` frees only the calling thread's cache), so after an insert the parser's and the part
writers' threads went on holding tens of MiB each; with mimalloc's ``purge_delay`` at 0 a freed span goes
back to the system at once, whichever thread freed it.  With ``arena_eager_commit`` at 0 mimalloc commits
its first arena as it uses it instead of all at once: committed whole, the arena was backed by transparent
huge pages (the kernel's ``madvise`` mode), and the few small allocations a resting daemon makes held two of
them, 4 MiB of its resident set (a resting daemon with one table: 122 -> 118 MiB, anonymous 65.4 -> 61.5).
They must be set before pyarrow is loaded: mimalloc reads its options once, when the library initialises.

:func:`limit_malloc_arenas`: one glibc malloc arena for the whole daemon, so that the trim after a big insert
(:func:`release_unused_memory`) reaches all of malloc's free memory (see :data:`MALLOC_ARENAS`).

:func:`import_without_default_tls`: aiohttp.connector makes two default TLS client contexts when imported,
each parsing the system's CA bundle (~2 MiB of the resident set); the daemon never uses them (its fetcher
checks HTTPS peers with a context of its own), so it imports aiohttp with the default CA locations unset.

:func:`defer_import`: ``pyarrow.compute`` registers Arrow's compute kernels when imported (about 7 MiB of the
resident set: the pages of libarrow_compute it touches, the Python wrappers it generates, pydoc).  A daemon
that only replicates never calls a kernel, so the daemon puts a stand-in in ``sys.modules`` that imports the
real module the first time one of its attributes is read; :func:`load_deferred` does it ahead, in a worker
thread, for the request handlers about to need it (an import of ~100 ms must not stall the event loop).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence

#: inserts whose body reached this size return their memory when they end (in the background; a small
#: insert never pays for it)
RELEASE_AFTER_BYTES = 8 << 20


@functools.cache
def _libc_function(name: str, *argtypes: type) -> Callable[..., int] | None:
    """glibc's ``name`` (int result), or None (another C library, or none found)."""
    lib = ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(lib), name) if lib else None
    except (OSError, AttributeError):  # not glibc
        return None
    if fn is None:
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    call: Callable[..., int] = fn
    return call


def _malloc_trim() -> Callable[[int], int] | None:
    return _libc_function("malloc_trim", ctypes.c_size_t)


#: glibc malloc arenas of the daemon process.  By default glibc gives each new thread an arena of its own (up
#: to 8 per core), and ``malloc_trim`` gives back the free pages inside an arena's chunks but never the free
#: space at the top of a thread's arena, which glibc's dynamic trim threshold lets grow to 64 MiB: after the
#: first 2 M-row insert the daemon went on holding ~65 MiB more (resting anonymous memory 56 -> 118-131
#: MiB, the 146 MB TSV insert's peak 261 -> 302-317 MiB once an insert had run in other threads).  With one
#: arena the top is the main heap's, which the trim returns: resting 61 MiB, that peak 233-242 MiB
#: (ClickHouse 18.16: 246-259), the fresh 4 M-row insert's growth 201-205 -> 142-145 MiB.  Throughput did
#: not move beyond the noise (2 M-row TSV and ArrowStream inserts, 4 clients of 10k-row blocks, 100-row
#: inserts: alternating runs); the hot allocations are Python's own (pymalloc), Arrow's (mimalloc) and
#: glibc's per-thread caches.
MALLOC_ARENAS = 1
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Make glibc's malloc use at most ``arenas`` arenas in this process (the daemon only; before it starts
    threads: a thread that allocated already keeps its arena).  False, and nothing changed, when the user
    chose (``MALLOC_ARENA_MAX``, or ``arena_max`` in ``GLIBC_TUNABLES``: glibc read it), when other threads
    run already, or without glibc."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if threading.active_count() > 1:
        return False
    mallopt = _libc_function("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1


def release_thread_cache() -> None:
    """Return what Arrow's allocator keeps for the calling thread (mimalloc: that thread's heap only)."""
    import pyarrow as pa  # here: tune_allocators must be able to run before pyarrow loads

    pa.default_memory_pool().release_unused()


def release_unused_memory() -> None:
    """Return freed memory of Arrow's pool and of malloc to the system (blocking: call it in a thread)."""
    import pyarrow as pa  # here: tune_allocators must be able to run before pyarrow loads

    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: packages the daemon never uses that its libraries import when installed: pandas (pyarrow, the first time
#: it checks whether an argument is a DataFrame: 35-55 MiB) and rich with pygments (structlog, for console
#: tracebacks; the daemon's JSON logs format exceptions as plain text: ~3 MiB)
UNUSED_PACKAGES = ("pandas", "rich", "pygments")


class _KeepOut(importlib.abc.MetaPathFinder):
    """Refuses to import some packages (an ImportError, which their importers take as "not installed")."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            raise ImportError(f"{fullname} is kept out of the replicad daemon (replicad.memory.keep_out)")
        return None


def keep_out(names: Sequence[str] = UNUSED_PACKAGES) -> bool:
    """Make importing ``names`` fail in this process from now on (for the daemon process only: it never uses
    them).  False, and nothing changed, when one of them is imported already."""
    if any(name in sys.modules for name in names):
        return False
    sys.meta_path.insert(0, _KeepOut(names))
    return True


def keep_pandas_out() -> bool:
    """:func:`keep_out` for pandas only."""
    return keep_out(("pandas",))


#: mimalloc options for the daemon process (environment variables; one the user set is kept).
#: ``purge_delay`` stays 0 although every fresh buffer then faults its pages in again.  A delay (mimalloc 3's
#: default is 1000 ms) saved ~9% of the daemon's CPU on a 2 M-row TSV insert (bench, one run each, load 3-10:
#: 1.02-1.14 s, median 1.10, in 5 runs at 0; 0.95-1.12 s, median 1.00, in 6 runs at 20, 50 and 200 ms) and
#: ~7% of a 10-part merge (0.45 -> 0.42 s, page faults 43 k -> 31 k), but the daemon's RSS growth on a fresh
#: 1 M-row TSV insert went from 109-130 MiB (median 110; ClickHouse 18.16: 114-121) to 122-145 MiB (median
#: 140, 1.21-1.27x in 5 of 6 runs: over the 1.2x bound), its peak on the 2 M-row insert from 248-259 to
#: 275-287 MiB.  The memory a thread frees is then held, not reused by the other threads' next blocks.
#: Small inserts fault 8-16 pages each: nothing to gain there.  With a delay, too, only a forced collection
#: *from the main thread* purges what worker threads freed (``release_unused`` in a worker thread left
#: 260 MiB resident, measured), and :func:`release_unused_memory` runs in a worker thread.  glibc's
#: ``M_MMAP_THRESHOLD`` fixed at 32 MiB with ``M_TRIM_THRESHOLD`` at 64 MiB cut the insert's CPU as much
#: (1.01 s) but made the fresh 1 M-row insert's growth 180 MiB: glibc keeps its dynamic thresholds.
MIMALLOC_OPTIONS = {"MIMALLOC_PURGE_DELAY": "0", "MIMALLOC_ARENA_EAGER_COMMIT": "0"}


def tune_allocators() -> bool:
    """Set :data:`MIMALLOC_OPTIONS` for Arrow's allocator (for the daemon process only, before pyarrow is
    imported).  False, and nothing changed, when pyarrow is loaded already."""
    if "pyarrow" in sys.modules:
        return False
    for name, value in MIMALLOC_OPTIONS.items():
        os.environ.setdefault(name, value)
    return True


#: OpenSSL's environment variables for its default CA file and directory
CA_LOCATION_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def import_without_default_tls(module: str = "aiohttp") -> bool:
    """Import ``module`` (aiohttp) with the default CA locations set to nothing for the time of the import
    (for the daemon process only, before any thread that reads the environment): the default contexts aiohttp
    makes then hold no CA, and one used by mistake would refuse every peer rather than trust one.  The fetcher
    passes its own context to every HTTPS request (replicad.replication.exchange.system_tls_context).  False,
    and nothing done, when ``module`` is imported already."""
    if module in sys.modules:
        return False
    saved = {name: os.environ.get(name) for name in CA_LOCATION_VARIABLES}
    os.environ.update(dict.fromkeys(CA_LOCATION_VARIABLES, os.devnull))
    try:
        importlib.import_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return True


#: modules the daemon imports on first use (:func:`defer_import`): Arrow's kernels, the insert formats'
#: parsers (with pyarrow's CSV and JSON readers, ~0.5 MiB), which a daemon that takes no insert never needs,
#: and the distributed DDL statements (ON CLUSTER)
DEFERRED_MODULES = ("pyarrow.compute", "replicad.server.formats", "replicad.ddl.service")


class DeferredModule(types.ModuleType):
    """Stands in ``sys.modules`` for a module not imported yet.  The first attribute read imports the real
    module (once, under a lock), copies its namespace into this one (later reads are plain lookups) and
    leaves the real module in ``sys.modules``; the modules that bound this stand-in keep working with it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_deferred_lock"] = threading.RLock()

    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__") and attr.endswith("__"):  # probes (copy, inspect, import) do not load it
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def load(self) -> types.ModuleType:
        """The real module, imported now if it is not yet."""
        name = self.__name__
        with self.__dict__["_deferred_lock"]:
            current = sys.modules.get(name)
            if current is not None and current is not self:  # loaded, or being loaded by this thread
                return current
            del sys.modules[name]
            try:
                real = importlib.import_module(name)
            except BaseException:
                sys.modules.setdefault(name, self)
                raise
            self.__dict__.update({k: v for k, v in real.__dict__.items() if k != "__name__"})
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:
                setattr(sys.modules[parent], child, real)
            return real


def defer_import(names: Sequence[str] = DEFERRED_MODULES) -> list[str]:
    """Put a :class:`DeferredModule` in ``sys.modules`` for each of ``names`` not imported yet (for the daemon
    process only); returns those deferred.  Their parent packages are imported now."""
    deferred = []
    for name in names:
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        stand_in = DeferredModule(name)
        if parent:
            setattr(importlib.import_module(parent), child, stand_in)
        sys.modules[name] = stand_in
        deferred.append(name)
    return deferred


def deferred_pending() -> bool:
    """Whether a module :func:`defer_import` deferred is still not imported."""
    return any(isinstance(sys.modules.get(name), DeferredModule) for name in DEFERRED_MODULES)


def load_deferred() -> None:
    """Import the deferred modules now (blocking: ~100 ms the first time; :func:`deferred_loaded` runs it in a
    worker thread)."""
    for name in DEFERRED_MODULES:
        module = sys.modules.get(name)
        if isinstance(module, DeferredModule):
            module.load()


async def deferred_loaded() -> None:
    """For the event loop, before work that uses a deferred module: imports them in a worker thread the first
    time, returns at once afterwards (or in a process that deferred nothing)."""
    if deferred_pending():
        import asyncio

        await asyncio.to_thread(load_deferred)
