"""PySpark finds data sources in top-level ``pyspark_*`` modules: with Sluice installed in the
Python that Spark's workers run, ``format("sluice")`` works without a registration call."""

from analytics.source import SluiceDataSource as DefaultSource

__all__ = ["DefaultSource"]
