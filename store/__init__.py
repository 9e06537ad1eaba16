"""The store: one commit log for every topic, consume queues, key index, compacted copies.

Bytes on disk only; imports nothing else from Sluice. See ``api.py`` for the contract. What this
module exports, with ``store.api`` and ``store.errors``, is the store's public API; its read-only
part, for code running with no broker, is ``StoreReader`` (``reader.py``) with the columns it
reads (``record_columns.py``, ``record_arrow.py``) and the tier in object storage (``tier/``).
The rest of Sluice imports nothing else of the store (tests/unit/test_dependency_direction.py).
"""
from .api import (AppendResult, KeyCursor, KeyPage, Message, RecoveryReport, RetentionReport,
                  SharedProperties, Store, StoreConfig)
from .durable_files import replace_file
from .errors import (CorruptRecordError, InvalidCursorError, InvalidRecordError, OffsetOutOfRangeError,
                     RecordTooLargeError, StoreClosedError, StoreDegradedError, StoreError, StoreLockedError)
from .file_store import FileStore
from .memory_store import MemoryStore
from .reader import StoreReader
from .record import StoredMessage

__all__ = [
    "AppendResult", "CorruptRecordError", "FileStore", "InvalidCursorError", "InvalidRecordError", "KeyCursor",
    "KeyPage", "MemoryStore", "Message", "OffsetOutOfRangeError", "RecordTooLargeError", "RecoveryReport",
    "RetentionReport", "SharedProperties", "Store", "StoreClosedError", "StoreConfig", "StoreDegradedError",
    "StoreError", "StoreLockedError", "StoreReader", "StoredMessage", "replace_file",
]
