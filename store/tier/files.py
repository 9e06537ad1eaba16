"""Parquet objects of a tier, read with range gets through one byte-bounded cache: footers,
whole decoded row groups, and column projections of whole files. Tiered objects are untrusted:
anything pyarrow cannot read, a page whose CRC does not match (when the writer stored page
checksums), or a missing column or one not of the contract's type raises TierDataError;
object-store failures (ObjectStoreError) pass through as they are.

Two guards keep a slow or failing object store from holding up its callers: inside
``cached_only()`` a read that would fetch raises TierFetchNeeded at once (the broker's event
loop reads that way, and runs such reads again in a thread), and after a failure every fetch
fails fast for ``FAIL_FAST_S`` seconds, saying when the failure was and to retry later."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import TierFetchNeeded
from .cache import ByteLRU
from .objects import ObjectNotFound, ObjectStore, ObjectStoreError
from .rangefile import RangeFile
from .rebuild import TierDataError

_UNREADABLE = (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError, EOFError)
FAIL_FAST_S = 5.0
"""After an object-store failure, fetches fail at once for this long (then one tries again)."""
_T = TypeVar("_T")
_THREAD = threading.local()


class cached_only:  # noqa: N801 (used like a function: ``with cached_only():``)
    """Within it, on this thread, a read that would fetch from object storage raises
    TierFetchNeeded instead of waiting for it; what is cached is read as usual."""

    def __enter__(self) -> None:
        self._before = getattr(_THREAD, "cached_only", False)
        _THREAD.cached_only = True

    def __exit__(self, *exc_info: object) -> None:
        _THREAD.cached_only = self._before


class ParquetObjects:
    """Cached, checked reads of the Parquet objects of ``objects``."""

    def __init__(self, objects: ObjectStore, cache_bytes: int) -> None:
        self.objects = objects
        self.cache = ByteLRU(cache_bytes)
        self._failed: tuple[float, ObjectStoreError] | None = None

    def _fetch(self, key: str, fetch: Callable[[], _T]) -> _T:
        """``fetch()`` of object ``key``, unless this thread is ``cached_only`` or the object
        store failed less than ``FAIL_FAST_S`` ago."""
        if getattr(_THREAD, "cached_only", False):
            raise TierFetchNeeded(f"reading tiered object {key} needs {self.objects.description}")
        failed = self._failed
        if failed is not None:
            ago = time.monotonic() - failed[0]
            if ago < FAIL_FAST_S:
                raise ObjectStoreError(f"{failed[1]} ({ago:.1f} s ago; tiered history is not read for "
                                       f"{FAIL_FAST_S - ago:.1f} s more: retry later)")
        try:
            found = fetch()
        except ObjectNotFound:
            raise
        except ObjectStoreError as error:
            self._failed = (time.monotonic(), error)
            raise
        self._failed = None
        return found

    def metadata(self, key: str, size: int | None = None) -> pq.FileMetaData:
        """The footer of ``key`` (``size``: the object's size if known, else asked for)."""
        return self._footer(key, size)[0]

    def _footer(self, key: str, size: int | None) -> tuple[pq.FileMetaData, int]:
        def load() -> tuple[tuple[pq.FileMetaData, int], int]:
            def fetch() -> tuple[pq.FileMetaData, int]:
                length = self.objects.size(key) if size is None else size
                return _checked(key, lambda: _footer(self.objects, key, length)), length
            meta, length = self._fetch(key, fetch)
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
            table = self._fetch(key, lambda: _checked(key, lambda: read(_open(self.objects, key, length, meta))))
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
