"""Non-blocking socket calls that keep the GIL, for the keeper's sockets.

Python's ``socket.send`` / ``recv`` let go of the GIL around the system call.  On a busy daemon (the loop, a
part writer and kazoo's connection thread all wanting the GIL) every such release is a chance for another
thread to take the GIL, and the caller then waits for it to be handed back: up to the 5 ms switch interval
when that thread runs Python code.  A non-blocking call (``MSG_DONTWAIT``) cannot wait, so it need not let
go: libc's ``send`` / ``recv`` called through :class:`ctypes.PyDLL`, which keeps the GIL.

Every function here answers "could not" (``-1``) instead of raising; the caller then falls back to the
socket's own (GIL-releasing, error-raising) call.  Without libc (another platform) they always answer -1.
"""

from __future__ import annotations

import ctypes
import errno
import socket
from typing import Any

_FLAGS = getattr(socket, "MSG_DONTWAIT", 0) | getattr(socket, "MSG_NOSIGNAL", 0)


def _libc_call(name: str, buf_type: Any) -> Any:
    try:
        fn = getattr(ctypes.PyDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, buf_type, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_ssize_t
    return fn


_SEND = _libc_call("send", ctypes.c_char_p) if _FLAGS & getattr(socket, "MSG_DONTWAIT", 0) else None
_RECV = _libc_call("recv", ctypes.c_void_p) if _FLAGS & getattr(socket, "MSG_DONTWAIT", 0) else None

AVAILABLE = _SEND is not None and _RECV is not None


def send(fd: int, data: bytes) -> int:
    """Bytes of ``data`` written to socket ``fd`` now (maybe fewer than all), or -1 (none: full buffer,
    an error, a closed socket, no libc)."""
    if _SEND is None or fd < 0:
        return -1
    while True:
        n: int = _SEND(fd, data, len(data), _FLAGS)
        if n >= 0 or ctypes.get_errno() != errno.EINTR:
            return n


class Receiver:
    """Reads what a socket has ready into a reusable buffer, keeping the GIL."""

    __slots__ = ("_buf", "_ptr", "_view")

    def __init__(self, size: int = 1 << 16) -> None:
        self._buf = bytearray(size)
        self._ptr = ctypes.addressof((ctypes.c_char * size).from_buffer(self._buf))
        self._view = memoryview(self._buf)

    def recv_into(self, fd: int, out: bytearray) -> int:
        """Append what socket ``fd`` has ready to ``out``: the byte count, 0 at the end of the stream, -1 when
        nothing is ready (or on any error: the socket's own recv tells which)."""
        if _RECV is None or fd < 0:
            return -1
        while True:
            n: int = _RECV(fd, self._ptr, len(self._buf), _FLAGS)
            if n > 0:
                out += self._view[:n]
                return n
            if n == 0:
                return 0
            if ctypes.get_errno() != errno.EINTR:
                return -1
