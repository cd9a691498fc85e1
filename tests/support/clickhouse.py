"""Moved to :mod:`replicad.devtools.clickhouse`; kept for branches in flight (remove once merged)."""

from replicad.devtools.clickhouse import ClickHouseError, ClickHouseServer, available, find_server_command

__all__ = ["ClickHouseError", "ClickHouseServer", "available", "find_server_command"]
