"""Tiered storage: sealed commit-log segments copied to object storage as Parquet.

``objects`` reaches the object store (a local directory or an S3 bucket), ``layout`` names the
objects, ``manifest`` records which of them make up the tier, ``body_schema`` turns a topic's
JSON Schema into typed columns, ``writer`` turns one segment into Parquet files and ``tierer``
runs it segment after segment. Imports nothing of Sluice above the store.
"""
from .objects import (LocalDirectory, ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreError, S3Bucket,
                      TierLocation, load_location, save_location)
from .manifest import Manifest, ManifestConflict, QueueSpan, TieredFile, TieredSegment

__all__ = [
    "LocalDirectory", "Manifest", "ManifestConflict", "ObjectInfo", "ObjectNotFound", "ObjectStore",
    "ObjectStoreError", "QueueSpan", "S3Bucket", "TierLocation", "TieredFile", "TieredSegment",
    "load_location", "save_location",
]
