"""Moved to :mod:`replicad.devtools.process`; kept for branches in flight (remove once merged)."""

from replicad.devtools.process import kill, spawn, tail, terminate

__all__ = ["kill", "spawn", "tail", "terminate"]
