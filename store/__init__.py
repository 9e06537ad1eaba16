"""The store: one commit log for every topic, consume queues, key index, compacted copies.

Bytes on disk only; imports nothing else from Sluice. See ``api.py`` for the contract.
"""
from .api import AppendResult, Message, RecoveryReport, RetentionReport, Store, StoreConfig
from .errors import (CorruptRecordError, InvalidRecordError, OffsetOutOfRangeError, RecordTooLargeError,
                     StoreClosedError, StoreDegradedError, StoreError, StoreLockedError)
from .file_store import FileStore
from .memory_store import MemoryStore
from .reader import StoreReader
from .record import StoredMessage

__all__ = [
    "AppendResult", "CorruptRecordError", "FileStore", "InvalidRecordError", "MemoryStore", "Message",
    "OffsetOutOfRangeError", "RecordTooLargeError", "RecoveryReport", "RetentionReport", "Store",
    "StoreClosedError", "StoreConfig", "StoreDegradedError", "StoreError", "StoreLockedError", "StoreReader",
    "StoredMessage",
]
