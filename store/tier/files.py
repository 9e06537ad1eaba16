"""Parquet objects of a tier, read with range gets through one byte-bounded cache: footers,
whole decoded row groups, and column projections of whole files. Tiered objects are untrusted:
anything pyarrow cannot read, or that lacks a column of the contract's type, raises
TierDataError; object-store failures (ObjectStoreError) pass through as they are."""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .cache import ByteLRU
from .objects import ObjectStore, ObjectStoreError
from .rangefile import RangeFile
from .rebuild import TierDataError

_UNREADABLE = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError, EOFError)


class ParquetObjects:
    """Cached, checked reads of the Parquet objects of ``objects``."""

    def __init__(self, objects: ObjectStore, cache_bytes: int) -> None:
        self.objects = objects
        self.cache = ByteLRU(cache_bytes)

    def metadata(self, key: str, size: int | None = None) -> pq.FileMetaData:
        """The footer of ``key`` (``size``: the object's size if known, else asked for)."""
        return self._footer(key, size)[0]

    def _footer(self, key: str, size: int | None) -> tuple[pq.FileMetaData, int]:
        def load() -> tuple[tuple[pq.FileMetaData, int], int]:
            length = self.objects.size(key) if size is None else size
            meta = _checked(key, lambda: pq.ParquetFile(RangeFile(self.objects, key, length)).metadata)
            return (meta, length), meta.serialized_size + 64
        return self.cache.get_or_load(("meta", key), load)

    def row_group(self, key: str, index: int, columns: Sequence[str], types: dict[str, pa.DataType]) -> pa.Table:
        """Row group ``index`` of ``key``, with ``columns`` checked against ``types``."""
        return self._load(("group", key, index, tuple(columns)), key, types,
                          lambda file: file.read_row_group(index, columns=list(columns)))

    def columns(self, key: str, columns: Sequence[str], types: dict[str, pa.DataType]) -> pa.Table:
        """``columns`` of every row of ``key``, checked against ``types``."""
        return self._load(("columns", key, tuple(columns)), key, types,
                          lambda file: file.read(columns=list(columns)))

    def _load(self, cache_key: Hashable, key: str, types: dict[str, pa.DataType],
              read: Callable[[pq.ParquetFile], pa.Table]) -> pa.Table:
        def load() -> tuple[pa.Table, int]:
            meta, length = self._footer(key, None)
            table = _checked(key, lambda: read(pq.ParquetFile(RangeFile(self.objects, key, length),
                                                               metadata=meta)))
            _check_types(key, table, types)
            return table, table.nbytes + 256
        return self.cache.get_or_load(cache_key, load)

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop cached reads of the objects ``keep`` refuses (no longer in the manifest)."""
        self.cache.discard(lambda cache_key: keep(cache_key[1]))  # type: ignore[index]


def _checked(key: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except ObjectStoreError:
        raise
    except _UNREADABLE as error:
        raise TierDataError(key, f"not a readable Parquet file ({type(error).__name__}: {error})") from None


def _check_types(key: str, table: pa.Table, types: dict[str, pa.DataType]) -> None:
    for name in table.column_names:
        wanted = types.get(name)
        if wanted is not None and not _same_type(table.schema.field(name).type, wanted):
            raise TierDataError(key, f"column {name} is {table.schema.field(name).type}, expected {wanted}")


def _same_type(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Equal types, ignoring the names of list items and map entries (writers differ there)."""
    if pa.types.is_list(wanted) or pa.types.is_large_list(wanted):
        return type(found) is type(wanted) and _same_type(found.value_type, wanted.value_type)
    if pa.types.is_map(wanted):
        return (pa.types.is_map(found) and _same_type(found.key_type, wanted.key_type)
                and _same_type(found.item_type, wanted.item_type))
    if pa.types.is_struct(wanted):
        return (pa.types.is_struct(found) and found.num_fields == wanted.num_fields
                and all(found.field(i).name == wanted.field(i).name
                        and _same_type(found.field(i).type, wanted.field(i).type)
                        for i in range(wanted.num_fields)))
    return found.equals(wanted)
