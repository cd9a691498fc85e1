"""Moved to :mod:`replicad.devtools.ports`; kept for branches in flight (remove once merged)."""

from replicad.devtools.ports import free_port, free_ports, port_is_open

__all__ = ["free_port", "free_ports", "port_is_open"]
