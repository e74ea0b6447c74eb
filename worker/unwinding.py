"""The exceptions that unwind a workflow function when a delivery must stop.

They derive from `BaseException`, not `Exception`, on purpose: workflow code routinely wraps
steps in `except Exception:`, and such a block must not be able to swallow a suspension or a
lost lease and carry on writing (the same reason `KeyboardInterrupt` and `SystemExit` do).
The context also remembers that it unwound, so even a bare `except:` cannot resume the workflow:
every later step call raises again.
"""


class Suspend(BaseException):
    """Raised inside a workflow to end the delivery as `Suspended`; a wake is already requested."""


class StopDelivery(BaseException):
    """Raised inside a workflow when its lease is lost or the parent is gone: no further writes."""


class RetryLater(BaseException):
    """Raised inside a workflow when the database stayed busy: the delivery ends as `Retry`.

    A busy database says nothing about the workflow, so its code must not be able to catch it
    as a step's error and take another path.
    """


class ReplayDiverged(BaseException):
    """Raised when a replay reaches an unnamed step that differs from the one recorded there."""
