# Minimal stubs: only what replicad uses (replicad.keeper.connection subclasses the handler).
import logging
import socket
from contextlib import AbstractContextManager
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import SequentialThreadingHandler

CLOSE_RESPONSE: int

class ConnectionHandler:
    client: KazooClient
    handler: SequentialThreadingHandler
    logger: logging.Logger
    sasl_options: Any
    _socket: socket.socket | None
    _read_sock: Any
    _write_sock: Any
    _xid: int
    def __init__(
        self, client: KazooClient, retry_sleeper: Any, logger: Any = ..., sasl_options: Any = ...
    ) -> None: ...
    def _socket_error_handling(self) -> AbstractContextManager[None]: ...
    def _connect(self, host: str, hostip: str, port: int) -> tuple[float, float]: ...
    def _connect_attempt(self, host: str, hostip: str, port: int, retry: Any) -> object: ...
    def _read(self, length: int, timeout: float) -> bytes: ...
    def _write(self, msg: bytes, timeout: float) -> None: ...
    def _read_socket(self, read_timeout: float) -> object: ...
    def _send_request(self, read_timeout: float, connect_timeout: float) -> None: ...
