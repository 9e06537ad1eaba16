"""A read-only, seekable file over one object, read with range gets: how Parquet's footer and
the row groups a read needs are fetched from object storage without downloading whole files."""
from __future__ import annotations

import io

from .objects import ObjectStore


class RangeFile(io.RawIOBase):
    """The object ``key`` of ``objects`` (``size`` bytes) as a file; every read is one range get."""

    def __init__(self, objects: ObjectStore, key: str, size: int) -> None:
        super().__init__()
        self._objects, self._key, self._size, self._pos = objects, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"seek before the start of {self._key}")
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        """The object's size (pyarrow asks for it)."""
        return self._size

    def readinto(self, buffer) -> int:  # type: ignore[override]
        length = min(len(buffer), self._size - self._pos)
        if length <= 0:
            return 0
        data = self._objects.get_range(self._key, self._pos, length)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)
