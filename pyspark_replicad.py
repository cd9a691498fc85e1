"""Spark 4 finds Python data sources in installed top-level modules named ``pyspark_*`` that export
``DefaultSource``: so ``format("replicad")`` works in a fresh SparkSession with no registration call."""

from replicad.spark.datasource import ReplicadDataSource as DefaultSource

__all__ = ["DefaultSource"]
