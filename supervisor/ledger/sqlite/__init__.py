"""The SQLite ledger backend."""

from .backend import SqliteBackend

__all__ = ["SqliteBackend"]
