"""Distributed DDL (``… ON CLUSTER c``) through ZooKeeper's task queue, as ClickHouse 18.16 runs it."""
