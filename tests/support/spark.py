"""A local[2,3] Spark session (2 cores, 3 attempts per task) with the ``replicad`` data source registered;
skips the test when Java or pyspark is missing."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def local_spark(app_name: str) -> Iterator[Any]:
    """Body of a ``spark`` fixture: ``yield from local_spark("name")``; the session stops afterwards."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed")
    pyspark_sql = pytest.importorskip("pyspark.sql")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (pyspark_sql.SparkSession.builder.master("local[2,3]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    import replicad.spark

    replicad.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


def staged_batch_dirs(staging_root: Path) -> list[Path]:
    """The staged batch directories (``b<N>``) under a daemon's ``staging/`` tree.  The daemon may remove
    one while this walks (a run published or dropped): that one is simply gone, never an error."""
    found = []
    for parent, dirs, _ in os.walk(staging_root):  # os.walk skips a directory removed under it
        found += [Path(parent) / d for d in dirs if d.startswith("b")]
    return sorted(found)
