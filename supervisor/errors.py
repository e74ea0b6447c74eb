"""The errors Yieldstar raises.

A lost lease is *not* among them: at the ledger level it is a normal reply (`LeaseLost`), because
losing a lease to a newer holder is the system working as designed, not a failure.
"""


class YieldstarError(Exception):
    """Root of every error raised by Yieldstar."""


class InvalidArgument(YieldstarError, ValueError):
    """Raised when an argument has the wrong type or value; nothing was written."""


class ExecutionConflict(InvalidArgument):
    """Raised when an execution id is admitted again with a different workflow or input."""


class UnknownExecution(InvalidArgument):
    """Raised when an operation names an execution that was never admitted."""


class StorageBusy(YieldstarError):
    """Raised when the database stayed locked by another process past the busy timeout."""
