"""Moved to :mod:`replicad.devtools.zookeeper`; kept for branches in flight (remove once merged)."""

from replicad.devtools.zookeeper import (
    NETTY_FACTORY,
    ZooKeeperServer,
    available,
    find_classpath,
    find_java,
    four_letter,
)

__all__ = ["NETTY_FACTORY", "ZooKeeperServer", "available", "find_classpath", "find_java", "four_letter"]
