"""Metadata: topics, consumer groups, subscriptions, users and permissions in SQLite or PostgreSQL.

``MetadataRepository`` is the one entry point; the other modules are its parts (engine set-up,
schema and migrations, password hashing, the master key file).
"""

from .master_key import BadMasterKey
from .repository import MetadataRepository
from .schema import LATEST_VERSION, SchemaTooNew

__all__ = ["BadMasterKey", "LATEST_VERSION", "MetadataRepository", "SchemaTooNew"]
