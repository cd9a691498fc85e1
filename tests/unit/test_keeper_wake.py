"""kazoo's wake-up socket pair as the keeper's handler makes it: each send of the write end (which keeps the
GIL) puts its byte at the read end, a full buffer falls back to the socket's own send, a closed write end
raises as a socket does."""

from __future__ import annotations

import threading

import pytest

from replicad.keeper.handler import PollHandler


def test_bytes_arrive_and_a_closed_end_raises() -> None:
    read_sock, write_sock = PollHandler().create_socket_pair()
    try:
        for _ in range(100):  # one-byte sends: a socket pair holds a few hundred
            assert write_sock.send(b"\0") == 1
        got = b""
        while len(got) < 100:
            got += read_sock.recv(4096)
        assert got == b"\0" * 100
    finally:
        write_sock.close()
        read_sock.close()
    with pytest.raises(OSError):
        write_sock.send(b"\0")


def test_a_full_buffer_waits_for_the_reader() -> None:
    read_sock, write_sock = PollHandler().create_socket_pair()
    raw = write_sock._sock
    try:
        raw.setblocking(False)
        filled = 0
        while True:
            try:
                filled += raw.send(b"\0" * 4096)
            except BlockingIOError:
                break
        raw.setblocking(True)
        drained = bytearray()

        def drain() -> None:
            while len(drained) < filled + 1:
                drained.extend(read_sock.recv(65536))

        reader = threading.Timer(0.2, drain)
        reader.start()
        assert write_sock.send(b"\0") == 1  # the non-blocking send could not: the socket's own send waited
        reader.join(10)
        assert len(drained) == filled + 1
    finally:
        write_sock.close()
        read_sock.close()
