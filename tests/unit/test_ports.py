"""Free test ports: unique within a process, and disjoint between pytest-xdist workers."""

from __future__ import annotations

import pytest

from replicad.devtools import ports


def test_ports_are_not_handed_out_twice() -> None:
    got = ports.free_ports(50)
    assert len(set(got)) == 50
    assert not set(got) & {2181, 8123, 9000, 9009}


@pytest.mark.parametrize(("worker", "count"), [("gw0", "2"), ("gw1", "2"), ("gw2", "3")])
def test_each_worker_draws_from_its_own_residue_class(
    monkeypatch: pytest.MonkeyPatch, worker: str, count: str
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    index, n = ports.worker_share()
    assert (index, n) == (int(worker[2:]), int(count))
    assert {(p // 2) % n for p in ports.free_ports(20)} == {index}


def test_outside_xdist_every_port_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert ports.worker_share() == (0, 1)
    assert len({(p // 2) % 2 for p in ports.free_ports(40)}) == 2


def test_ports_are_drawn_below_the_ephemeral_range() -> None:
    lo, _hi = ports.ephemeral_range()
    if lo - ports.LOWEST < ports.MIN_SPAN:
        pytest.skip("no room below this machine's ephemeral range")
    got = ports.free_ports(30)
    assert all(ports.LOWEST <= p < lo for p in got)  # never a port an outgoing connection may take
