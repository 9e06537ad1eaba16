"""The ceiling of any PySpark Python data source here: one that decodes nothing.

``format("sluice_ceiling")`` yields the same pre-built Arrow batch of real telemetry bodies over
and over (``body BINARY``, ``records`` rows over ``partitions`` partitions), so timing it beside
the ``sluice`` source separates what Spark's Python data source path costs (Arrow from the
Python worker into the JVM) from what the source's own decoding costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

BATCH_ROWS = 4096


class CeilingSource(DataSource):
    """Options: ``lines`` (a JSON lines file to take bodies from), ``records``, ``partitions``."""

    @classmethod
    def name(cls) -> str:
        return "sluice_ceiling"

    def schema(self) -> str:
        return "body BINARY"

    def reader(self, schema: StructType) -> DataSourceReader:
        return CeilingReader(self.options)


class CeilingReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.lines = options["lines"]
        self.records = int(options["records"])
        self.partition_count = int(options["partitions"])

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(index) for index in range(self.partition_count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        with open(self.lines, "rb") as file:
            bodies = [line.rstrip(b"\n") for line in itertools.islice(file, BATCH_ROWS)]
        batch = pa.RecordBatch.from_arrays([pa.array(bodies, pa.binary())], names=["body"])
        remaining = self.records // self.partition_count
        while remaining > 0:
            yield batch if remaining >= len(batch) else batch.slice(0, remaining)
            remaining -= len(batch)
