"""Spark integration: the ``replicad`` Python Data Source (see :mod:`replicad.spark.datasource`).

Installed, the package is found by Spark 4 without a call (module ``pyspark_replicad``); ``register(spark)``
registers it explicitly.  pyspark is only imported when this package's names are used, so the daemon does
not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replicad.spark.datasource import (
        ReplicadDataSource,
        ReplicadSparkError,
        ReplicadWriter,
        WriteOptions,
        dedup_token,
    )

__all__ = ["ReplicadDataSource", "ReplicadSparkError", "ReplicadWriter", "WriteOptions", "dedup_token",
           "register"]


def register(spark: Any) -> None:
    """Register the ``replicad`` data source with ``spark`` (a SparkSession)."""
    from replicad.spark.datasource import register as _register

    _register(spark)


def __getattr__(name: str) -> Any:
    if name in __all__:
        from replicad.spark import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
