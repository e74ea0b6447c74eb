"""The exceptions that unwind a workflow function when a delivery must stop.

They derive from `BaseException`, not `Exception`, on purpose: workflow code routinely wraps
steps in `except Exception:`, and such a block must not be able to swallow a suspension or a
lost lease and carry on writing (the same reason `KeyboardInterrupt` and `SystemExit` do).
The context also remembers that it unwound, so even a bare `except:` cannot resume the workflow:
every later step call raises again.
"""

from supervisor.ledger.arguments import MAX_DETAIL_LENGTH


class Suspend(BaseException):
    """Raised inside a workflow to end the delivery as `Suspended`; a wake is already requested."""

    # Set when it waits to retry a step whose attempt failed in this delivery: the attempt's error
    # as JSON `{"type", "message", "step", "attempt"}`, which `Suspended.step_error_json` carries to
    # the supervisor's log line.
    step_error: "str | None" = None


class StopDelivery(BaseException):
    """Raised inside a workflow when its lease is lost or the parent is gone: no further writes."""


class RetryLater(BaseException):
    """Raised inside a workflow when the ledger's storage failed a call (busy past the timeout,
    a full disk, an I/O error, a corrupt file): the delivery ends as `Retry` naming the kind.

    A storage failure says nothing about the workflow, so its code must not be able to catch
    it as a step's error and take another path, nor record it as the workflow's outcome.
    """

    def __init__(self, reason: str, storage_error: str):
        super().__init__(reason, storage_error)
        self.reason = reason
        self.storage_error = storage_error  # the `StorageError.kind` that ended the delivery

    def __str__(self) -> str:
        return self.reason


class ReplayDiverged(Suspend):
    """Raised when a replay breaks the order rule (`worker._runtime.order`): the code reached a
    step the records do not have, or a recorded step out of its order. No step function runs and
    nothing is written; the delivery ends as `Suspended(diverged=detail)`, which parks the
    execution (it suspends without a wake, so it is a `Suspend`, and a step in flight in another
    task lands before it unwinds)."""

    def __init__(self, detail: str):
        # One line naming the recorded step and the step the code reached; never longer than
        # the ledger takes (two step keys of 255 characters fit many times over).
        if len(detail) > MAX_DETAIL_LENGTH:
            detail = detail[:MAX_DETAIL_LENGTH - 1] + "…"
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class EndOfHistory(Suspend):
    """Raised in a check replay (`worker._runtime.check`) at the first step it has no record of,
    or at the first write it would make: the check goes no further, and nothing runs."""
