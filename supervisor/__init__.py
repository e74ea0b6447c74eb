"""Yieldstar's parent side: the ledger, the dispatcher, the child pool and the CLI.

The ledger API (SPEC section 3) is importable from here; each name is imported when first used
(`supervisor.exports`).
"""

from .exports import lazy_exports

_WHERE = {
    "open_backend": ".ledger.backends",
    "SqliteBackend": ".ledger.sqlite.backend",
    **dict.fromkeys(["ExecutionLease", "ExecutionRecord", "HeapRecord", "LeaseRecord", "Suspended", "Completed",
                     "Failed", "Renewed", "Released", "LeaseLost", "Retry", "ExecutionStatus", "DeliveryEnd"],
                    ".ledger.values"),
    **dict.fromkeys(["YieldstarError", "InvalidArgument", "ExecutionConflict", "UnknownExecution", "StorageBusy"],
                    ".ledger.errors"),
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
