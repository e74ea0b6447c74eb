"""Yieldstar's parent side: the ledger, the dispatcher, the child pool and the CLI.

The ledger API (SPEC section 3) is importable from here.
"""

from .errors import ExecutionConflict, InvalidArgument, StorageBusy, UnknownExecution, YieldstarError
from .backends import open_backend
from .sqlite.backend import SqliteBackend
from .values import (
    Completed,
    DeliveryEnd,
    ExecutionLease,
    ExecutionRecord,
    ExecutionStatus,
    Failed,
    HeapRecord,
    LeaseLost,
    LeaseRecord,
    Released,
    Renewed,
    Retry,
    Suspended,
)

__all__ = [
    "open_backend", "SqliteBackend",
    "ExecutionLease", "ExecutionRecord", "HeapRecord", "LeaseRecord",
    "Suspended", "Completed", "Failed", "Renewed", "Released", "LeaseLost", "Retry",
    "ExecutionStatus", "DeliveryEnd",
    "YieldstarError", "InvalidArgument", "ExecutionConflict", "UnknownExecution", "StorageBusy",
]
