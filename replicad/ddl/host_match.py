"""Is a task's host id this daemon?  As ClickHouse 18.16's DDLWorker decides it: the id's port is this
server's TCP port and its host resolves to an address of this machine (``isLocalAddress``), so
``127.0.0.1:9000``, ``localhost:9000``, ``<hostname>:9000`` and ``<interface address>:9000`` all name the
daemon listening as port 9000, and ``127.0.0.1:9001`` does not.  The spelling the config gives the daemon
(``distributed_ddl.host``/``port``) matches without any resolution.

Address literals, ``localhost`` and this machine's host name are decided at once, without a lookup.  Other
names are resolved in a small thread pool of its own (``getaddrinfo`` blocks; a hung DNS lookup must not
take the event loop's default executor), results are cached for :data:`CACHE_TTL_S`, and one look at a
task's hosts waits at most ``timeout_s`` in all: a name that cannot be resolved in time, or at all, is "not
this host" (the task is then not executed here; a later task naming it may match once its lookup
finished, so list daemons by address or by their configured spelling where DNS is slow).  Names that are
not host names (too long, control characters, an empty label) are never resolved.

An address is local when it is a loopback address or one a socket can be bound to (the kernel's own test
of "an address of this machine"; the unspecified and multicast addresses never are).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from replicad.ddl.entry import host_id, split_host_id
from replicad.logging import get_logger

log = get_logger(__name__)

CACHE_TTL_S = 10.0
TIMEOUT_S = 2.0
_WORKERS = 4
_LOOPBACK_NAMES = frozenset(("localhost", "localhost.", "localhost.localdomain", "ip6-localhost"))
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_-]{1,63})*\.?")

Resolve = Callable[[str], list[str]]


def resolve_addresses(host: str) -> list[str]:
    """The addresses ``host`` resolves to (blocking: run it in a thread)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_local_address(address: str) -> bool:
    """Loopback, or an address of one of this machine's interfaces (a socket can be bound to it)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    if ip.is_unspecified or ip.is_multicast:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def _resolvable(host: str) -> bool:
    return 0 < len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None


class LocalHosts:
    """This daemon's identity in tasks' host lists (see the module doc)."""

    def __init__(self, host: str, port: int, *, timeout_s: float = TIMEOUT_S, ttl_s: float = CACHE_TTL_S,
                 resolve: Resolve = resolve_addresses) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._resolve = resolve
        self._pool: ThreadPoolExecutor | None = None
        self._cache: dict[str, tuple[float, bool]] = {}
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self._own_names = {n.lower() for n in (socket.gethostname(), socket.gethostname() + ".") if n}

    def _known(self, host: str) -> bool | None:
        """Decided without a lookup: an address literal, ``localhost``, this machine's name; else None."""
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            ipaddress.ip_address(bare.split("%", 1)[0])
        except ValueError:
            pass
        else:
            return is_local_address(bare)
        if bare.lower() in _LOOPBACK_NAMES or bare.lower() in self._own_names:
            return True
        return None if _resolvable(bare) else False

    def _local(self, host: str) -> bool:  # in a pool thread
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            return any(is_local_address(a) for a in self._resolve(bare))
        except (OSError, UnicodeError, ValueError):
            return False

    def _lookup(self, host: str) -> asyncio.Future[bool]:
        fut = self._inflight.get(host)
        if fut is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="ddl-resolve")
            fut = asyncio.wrap_future(self._pool.submit(self._local, host))
            self._inflight[host] = fut

            def done(f: asyncio.Future[bool], host: str = host) -> None:
                self._inflight.pop(host, None)
                ok = not f.cancelled() and f.exception() is None and bool(f.result())
                self._cache[host] = (time.monotonic() + self.ttl_s, ok)

            fut.add_done_callback(done)
        return fut

    async def local_hosts(self, hosts: Sequence[str]) -> set[str]:
        """Which of ``hosts`` (host names) are this machine, waiting ``timeout_s`` at most in all."""
        now = time.monotonic()
        out: set[str] = set()
        waiting: dict[str, asyncio.Future[bool]] = {}
        for h in dict.fromkeys(hosts):
            known = self._known(h)
            cached = self._cache.get(h)
            if known is not None:
                if known:
                    out.add(h)
            elif cached is not None and cached[0] > now:
                if cached[1]:
                    out.add(h)
            else:
                waiting[h] = self._lookup(h)
        if waiting:
            _done, pending = await asyncio.wait([asyncio.shield(f) for f in waiting.values()],
                                                timeout=self.timeout_s)
            if pending:
                log.warning("ddl_host_resolution_slow", hosts=[h for h, f in waiting.items() if not f.done()],
                            timeout_s=self.timeout_s)
            out |= {h for h, f in waiting.items() if f.done() and not f.cancelled()
                    and f.exception() is None and f.result()}
        return out

    async def first_match(self, ids: Sequence[str]) -> str | None:
        """The first listed id (canonical form) that is this daemon, as 18.16 picks it; None: not listed."""
        parsed: list[tuple[str, str, int]] = []
        for text in ids:
            try:
                host, port = split_host_id(text)
            except ValueError:
                continue
            if port == self.port:
                parsed.append((text, host, port))
        if not parsed:
            return None
        if (self.host, self.port) in {(h, p) for _t, h, p in parsed}:
            local = {self.host}
        else:
            local = set()
        local |= await self.local_hosts([h for _t, h, _p in parsed if h != self.host])
        matches = [host_id(h, p) for _t, h, p in parsed if h in local]
        if len(set(matches)) > 1:
            log.warning("ddl_task_lists_this_host_twice", ids=matches, used=matches[0])
        return matches[0] if matches else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
