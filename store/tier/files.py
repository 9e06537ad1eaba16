"""Parquet objects of a tier, read with range gets through one byte-bounded cache: footers,
whole decoded row groups, and column projections of whole files. Tiered objects are untrusted:
anything pyarrow cannot read, a page whose CRC does not match (when the writer stored page
checksums), or a missing column or one not of the contract's type raises TierDataError;
object-store failures (ObjectStoreError) pass through as they are."""
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
            meta = _checked(key, lambda: _footer(self.objects, key, length))
            return (meta, length), meta.serialized_size + 64
        return self.cache.get_or_load(("meta", key), load)

    def row_group(self, key: str, index: int, columns: Sequence[str], types: dict[str, pa.DataType]) -> pa.Table:
        """Row group ``index`` of ``key``, with ``columns`` checked against ``types``."""
        return self._load(("group", key, index, tuple(columns)), key, columns, types,
                          lambda file: file.read_row_group(index, columns=list(columns)))

    def columns(self, key: str, columns: Sequence[str], types: dict[str, pa.DataType]) -> pa.Table:
        """``columns`` of every row of ``key``, checked against ``types``."""
        return self._load(("columns", key, tuple(columns)), key, columns, types,
                          lambda file: file.read(columns=list(columns)))

    def _load(self, cache_key: Hashable, key: str, columns: Sequence[str], types: dict[str, pa.DataType],
              read: Callable[[pq.ParquetFile], pa.Table]) -> pa.Table:
        def load() -> tuple[pa.Table, int]:
            meta, length = self._footer(key, None)
            table = _checked(key, lambda: read(_open(self.objects, key, length, meta)))
            _check_columns(key, table, columns, types)
            return table, table.nbytes + 256
        return self.cache.get_or_load(cache_key, load)

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop cached reads of the objects ``keep`` refuses (no longer in the manifest)."""
        self.cache.discard(lambda cache_key: keep(cache_key[1]))  # type: ignore[index]


_TAIL = 16 << 10  # the first range get of a footer: most footers fit


def _footer(objects: ObjectStore, key: str, size: int) -> pq.FileMetaData:
    """The footer of ``key`` with one range get, two if it is longer than ``_TAIL``."""
    tail = objects.get_range(key, max(0, size - _TAIL), min(size, _TAIL))
    if len(tail) < 12 or tail[-4:] != b"PAR1":
        raise ValueError(f"{size} bytes that do not end with Parquet's magic number")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 12 > size:
        raise ValueError(f"its footer claims {length} bytes, more than the file holds")
    if length + 8 > len(tail):
        tail = objects.get_range(key, size - length - 8, length - len(tail) + 8) + tail
    return pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-length - 8:]))


def _open(objects: ObjectStore, key: str, size: int, meta: pq.FileMetaData | None) -> pq.ParquetFile:
    """``key`` as a Parquet file read with range gets, its page checksums verified."""
    return pq.ParquetFile(RangeFile(objects, key, size), metadata=meta, page_checksum_verification=True)


def _checked(key: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except ObjectStoreError:
        raise
    except _UNREADABLE as error:
        raise TierDataError(key, f"not a readable Parquet file ({type(error).__name__}: {error})") from None


def _check_columns(key: str, table: pa.Table, columns: Sequence[str], types: dict[str, pa.DataType]) -> None:
    """Every one of ``columns`` is in ``table``, once, of its type in ``types``."""
    for name in columns:
        if len(table.schema.get_all_field_indices(name)) != 1:
            raise TierDataError(key, f"it has no column {name} (or more than one)")
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
