"""PySpark data source over the store reader or the native SDK, telemetry jobs and dashboard."""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make ``format("sluice")`` available in ``spark`` (a SparkSession) explicitly, for
    interpreters where the ``pyspark_sluice`` module is not on the workers' path."""
    from .source import SluiceDataSource

    spark.dataSource.register(SluiceDataSource)
