"""replicad.keeper.poll.poll_select: select() semantics on real sockets."""

from __future__ import annotations

import socket
import time

import pytest

from replicad.keeper.poll import poll_select


def test_readable_writable_and_timeout() -> None:
    a, b = socket.socketpair()
    with a, b:
        t0 = time.monotonic()
        assert poll_select([a], [], [], 0.05) == ([], [], [])
        assert time.monotonic() - t0 >= 0.04  # it waited
        r, w, x = poll_select([a, b], [a], [], 0)
        assert (r, w, x) == ([], [a], [])
        b.send(b"x")
        r, w, _ = poll_select([a, b], [], [], 1.0)
        assert r == [a] and w == []
        assert poll_select([a.fileno()], [], [], 0)[0] == [a.fileno()]  # plain descriptors too


def test_hang_up_wakes_the_reader() -> None:
    a, b = socket.socketpair()
    with a:
        b.close()
        r, _, _ = poll_select([a], [], [], 1.0)
        assert r == [a] and a.recv(1) == b""


def test_bad_arguments() -> None:
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(ValueError):
            poll_select([a], [], [], -1)
    with pytest.raises(TypeError):
        poll_select([a], [], [], 0)  # closed: fileno() is -1
