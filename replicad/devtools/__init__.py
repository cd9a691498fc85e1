"""Development helpers shared by ``make run`` (``scripts/run_cluster.py``), the benchmarks (``bench/``) and
the tests (``tests/support``): starting and stopping ZooKeeper, ClickHouse 18.16 and replicad processes on
loopback ports, and a local Spark job.  Not part of the daemon: no other module under ``replicad/`` imports
it (an import-linter contract in pyproject.toml), and the wheel leaves it out.
"""
