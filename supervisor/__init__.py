"""Yieldstar's parent side: the ledger, the dispatcher, the child pool and the CLI.

The ledger API (SPEC section 3) is importable from here.
"""

from .ledger.errors import (
    ExecutionConflict,
    InvalidArgument,
    PayloadTooLarge,
    StorageBusy,
    UnknownExecution,
    YieldstarError,
)
from .ledger.backends import open_backend
from .ledger.contract import Backend
from .ledger.sqlite.backend import SqliteBackend
from .ledger.values import (
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
    StepWrite,
    Suspended,
    SupervisorRecord,
)

__all__ = [
    "open_backend", "Backend", "SqliteBackend",
    "ExecutionLease", "ExecutionRecord", "HeapRecord", "LeaseRecord", "StepWrite", "SupervisorRecord",
    "Suspended", "Completed", "Failed", "Renewed", "Released", "LeaseLost", "Retry",
    "ExecutionStatus", "DeliveryEnd",
    "YieldstarError", "InvalidArgument", "ExecutionConflict", "UnknownExecution", "StorageBusy", "PayloadTooLarge",
]
