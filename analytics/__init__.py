"""PySpark data source over the store reader or the native SDK, telemetry jobs and dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
"""The live telemetry dashboard's static files, which the broker's admin API serves."""


def register(spark: Any) -> None:
    """Make ``format("sluice")`` available in ``spark`` (a SparkSession) explicitly, for
    interpreters where the ``pyspark_sluice`` module is not on the workers' path, and have its
    batch reads scan tiered history with Spark's own Parquet reader (planner.py)."""
    from .planner import install
    from .source import SluiceDataSource

    spark.dataSource.register(SluiceDataSource)
    install(spark)
