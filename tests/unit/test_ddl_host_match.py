"""Which host ids of a task name this daemon (18.16's DDLWorker: the port is the daemon's and the host
resolves to an address of this machine), with real name resolution, and bounded when resolution hangs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from replicad.ddl.host_match import LocalHosts, is_local_address, resolve_addresses

PORT = 9301


def interface_address() -> str | None:
    """A non-loopback address of this machine (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.254", 9))  # no packet is sent: just picks the source address
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_local_addresses() -> None:
    assert is_local_address("127.0.0.1") and is_local_address("127.3.4.5") and is_local_address("::1")
    assert not is_local_address("0.0.0.0") and not is_local_address("::")
    assert not is_local_address("203.0.113.9") and not is_local_address("224.0.0.1")
    assert not is_local_address("not an address")
    addr = interface_address()
    if addr is not None:
        assert is_local_address(addr)


async def test_the_spellings_of_this_host_match_on_its_port_only() -> None:
    hosts = LocalHosts("127.0.0.1", PORT)
    try:
        assert await hosts.first_match([f"127%2E0%2E0%2E1:{PORT}"]) == f"127%2E0%2E0%2E1:{PORT}"
        assert await hosts.first_match([f"127.0.0.1:{PORT}"]) == f"127%2E0%2E0%2E1:{PORT}"  # canonical
        assert await hosts.first_match([f"localhost:{PORT}"]) == f"localhost:{PORT}"
        assert await hosts.first_match([f"127%2E0%2E0%2E2:{PORT}"]) == f"127%2E0%2E0%2E2:{PORT}"
        me = socket.gethostname()
        if any(is_local_address(a) for a in resolve_addresses(me)):
            assert await hosts.first_match([f"{me}:{PORT}"]) is not None
        addr = interface_address()
        if addr is not None:
            listed = f"{addr.replace('.', '%2E')}:{PORT}"
            assert await hosts.first_match([listed]) == listed
        # another port, a foreign address, an unresolvable name: not this daemon
        assert await hosts.first_match([f"localhost:{PORT + 1}", f"127%2E0%2E0%2E1:{PORT + 1}"]) is None
        assert await hosts.first_match([f"203%2E0%2E113%2E9:{PORT}"]) is None
        assert await hosts.first_match([f"nosuch%2Dhost%2Einvalid:{PORT}"]) is None
        # the first matching id is the task's id for this daemon (18.16 answers only that one)
        assert await hosts.first_match([f"203%2E0%2E113%2E9:{PORT}", f"localhost:{PORT}",
                                        f"127%2E0%2E0%2E1:{PORT}"]) == f"localhost:{PORT}"
    finally:
        hosts.close()


async def test_hostile_names_are_never_resolved() -> None:
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    hosts = LocalHosts("10.1.1.1", PORT, resolve=resolve)
    hostile = ["a" * 300, "a%00b", "%2E%2E%2Fetc", "a b", "-x", "a..b", "", "%0A"]
    try:
        assert await hosts.first_match([f"{h}:{PORT}" for h in hostile] + ["garbage", ":", "x:y"]) is None
        assert asked == []
        assert await hosts.first_match([f"fine%2Dname:{PORT}"]) == f"fine%2Dname:{PORT}"
        assert asked == ["fine-name"]
    finally:
        hosts.close()


async def test_a_hanging_resolution_is_bounded_and_not_this_host() -> None:
    release = threading.Event()

    def resolve(host: str) -> list[str]:
        if host.startswith("slow"):
            release.wait(30)
            return ["127.0.0.1"]
        return ["127.0.0.1"] if host == "fast" else ["203.0.113.9"]

    hosts = LocalHosts("10.1.1.1", PORT, timeout_s=0.5, resolve=resolve)
    try:
        t0 = time.monotonic()
        assert await hosts.first_match([f"slow1:{PORT}", f"fast:{PORT}"]) == f"fast:{PORT}"
        # every lookup thread hung: names still wait no longer than the bound and do not match;
        # addresses, localhost and this machine's name need no lookup and still do
        slow = [f"slow{i}:{PORT}" for i in range(2, 12)]
        assert await hosts.first_match(slow) is None
        assert await hosts.first_match([*slow, f"localhost:{PORT}"]) == f"localhost:{PORT}"
        assert await hosts.first_match([*slow, f"127%2E0%2E0%2E1:{PORT}"]) == f"127%2E0%2E0%2E1:{PORT}"
        assert await hosts.first_match([*slow, f"{socket.gethostname()}:{PORT}"]) is not None
        assert time.monotonic() - t0 < 3.0
        # the event loop was never blocked meanwhile
        t1 = time.monotonic()
        await asyncio.sleep(0.01)
        assert time.monotonic() - t1 < 0.2
    finally:
        release.set()
        hosts.close()


@pytest.mark.parametrize("listed", ["box1", "box1%2Eexample%2Eorg", "BOX2"])
async def test_cache_answers_again_without_resolving(listed: str) -> None:
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    hosts = LocalHosts("10.1.1.1", PORT, resolve=resolve)
    try:
        for _ in range(3):
            assert await hosts.first_match([f"{listed}:{PORT}"]) is not None
        assert len(asked) == 1
    finally:
        hosts.close()
