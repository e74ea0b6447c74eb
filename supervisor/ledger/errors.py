"""The errors Yieldstar raises: one root, `YieldstarError`, and a few branches.

    YieldstarError
    +-- InvalidArgument (a ValueError)  bad input; nothing was written
    |   +-- ExecutionConflict           an id admitted again with another workflow or input
    |   +-- UnknownExecution            no execution has that id
    |   +-- UnknownStep                 a fork from a step the execution has not recorded
    |   +-- UnknownEffect               a settle of an effect no execution has begun
    |   +-- PayloadTooLarge             a JSON payload above the ledger's max_payload_bytes
    +-- WorkflowError                   a workflow or step ended without the value asked for
    |   +-- WorkflowFailed              `result()` of a failed execution
    |   +-- WorkflowCancelled           `result()` of a cancelled execution
    |   +-- StepFailed                  raised into a workflow: a step failed for good
    |   +-- StepTimeout                 a step attempt ran past its `timeout=` (recorded, then retried)
    |   +-- WorkflowStuck               an in-process test run can make no progress
    +-- DeliveryEnded (a RuntimeError)  a workflow's ctx used after its delivery ended; nothing was written
    +-- AppError                        the user's app cannot be found or loaded
    |   +-- AppNotFound                 the APP module or file cannot be imported
    |   +-- AppLoadFailed               a worker process cannot import the app
    |       +-- DiedWhileStarting       worker processes keep dying before they say
    +-- LedgerInUse                     a restore refused while processes use the ledger
    +-- StorageError                    the ledger's storage failed a call (below)

Both sides import them from here: the supervisor, and the `worker` package, whose public
surface re-exports the ones users catch. An error of one part of the supervisor is defined beside
its raiser and still derives from `YieldstarError` (the chaos harness's `ChaosInterrupted`). The
exceptions that unwind a workflow in a child (`worker._runtime.unwinding`) derive from `BaseException`
instead, so a workflow's own `except Exception` cannot swallow them.

A lost lease is *not* among them: at the ledger level it is a normal reply (`LeaseLost`), because
losing a lease to a newer holder is the system working as designed, not a failure.

Storage failures reach everything above the ledger as one of a few `StorageError` branches,
never as a database driver's own exception, so callers decide on the kind of failure:

    StorageError
    +-- StorageBusy          transient: the database stayed locked past the busy timeout
    +-- StorageUnavailable   transient: disk full, an I/O error, out of memory
    +-- LedgerUnusable       lasting: retrying cannot help; an operator must act
        +-- StorageCorrupt   the file is damaged
        +-- NotALedger       the file is not a Yieldstar ledger (or not a database at all)
        +-- SchemaTooNew     the file was written by a newer Yieldstar
        +-- UnsafeLedgerFile the file (or its -wal/-shm) is a symlink, another user's, or open to others
        +-- NoLedger         there is no ledger at the path, and the caller asked not to create one
        +-- LedgerGone       the file (or its -wal/-shm) was deleted or replaced, a database refuses
                             writes (a standby), or this user may no longer write

`LedgerInUse` (a restore refused while processes use the ledger) is not a storage failure.

A transient error is worth retrying, and never a workflow's outcome; a lasting one stops a
supervisor with a message that says what to do.
"""

from __future__ import annotations

from typing import Optional


class YieldstarError(Exception):
    """Root of every error raised by Yieldstar."""


class InvalidArgument(YieldstarError, ValueError):
    """Raised when an argument has the wrong type or value; nothing was written."""


class ExecutionConflict(InvalidArgument):
    """Raised when an execution id is admitted again with a different workflow or input."""


class UnknownExecution(InvalidArgument):
    """Raised when an operation names an execution that was never admitted."""


class UnknownStep(InvalidArgument):
    """Raised when a step key names no step recorded for the execution (a fork's `from_step`);
    nothing was written.

    Attributes:
        name: the argument that gave the key, as the message names it (`from_step`, or on the
            command line `--from-step`).
        execution_id: the execution whose steps were looked in.
        step_key: the key that is not among them.
        recorded: the execution's recorded step keys, in the order they were first recorded.
    """

    SHOWN = 10  # recorded keys the message lists at most

    def __init__(self, name: str, execution_id: str, step_key: str, recorded: tuple[str, ...]):
        shown = ", ".join(repr(key) for key in recorded[:self.SHOWN])
        if len(recorded) > self.SHOWN:
            shown += f" and {len(recorded) - self.SHOWN} more"
        super().__init__(f"{name} {step_key!r} is not a recorded step of execution {execution_id!r}"
                         f" ({f'its recorded steps: {shown}' if recorded else 'it has recorded no step'});"
                         " nothing was forked")
        self.name, self.execution_id, self.step_key, self.recorded = name, execution_id, step_key, recorded

    def __reduce__(self):
        return type(self), (self.name, self.execution_id, self.step_key, self.recorded)


def fork_id_taken(name: str, new_id: str) -> ExecutionConflict:
    """The error of a fork to an id that is taken, naming the argument that gave it (`new_id`;
    the client's `id`, the command line's `--id`)."""
    return ExecutionConflict(f"{name} {new_id!r} is taken: a fork is a new execution and needs an id no execution"
                             " has; nothing was forked")


class UnknownEffect(InvalidArgument):
    """Raised when an effect no execution has begun is settled without asking to create it."""


class PayloadTooLarge(InvalidArgument):
    """Raised when a JSON payload (an input, a step's result, an outcome, a store's value...) is
    longer than the ledger client's `max_payload_bytes`; nothing was written.

    Attributes:
        name: what the payload is, as the message names it (`input`, `result`, ...).
        size: its length in bytes of UTF-8 JSON text.
        limit: the limit it is above.
        setting: what sets the limit, as the user would change it (`max_payload_bytes`, or on
            the command line `--max-payload`).
    """

    def __init__(self, name: str, size: int, limit: int, setting: str = "max_payload_bytes"):
        super().__init__(f"{name} is {size:,} bytes of JSON, above the payload limit of {limit:,} bytes"
                         f" ({setting})")
        self.name, self.size, self.limit, self.setting = name, size, limit, setting

    def __reduce__(self):
        return type(self), (self.name, self.size, self.limit, self.setting)


class WorkflowError(YieldstarError):
    """Raised when a workflow or one of its steps ended without the value the caller asked for."""


class WorkflowFailed(WorkflowError):
    """Raised by `result()` of an execution that failed. `error` is its recorded error: a dict
    with `type`, `message` and `traceback` (the workflow's own, as a string, or None)."""

    def __init__(self, execution_id: str, error: dict):
        self.execution_id = execution_id
        self.error = error
        super().__init__(f"execution {execution_id!r} failed: {error.get('type')}: {error.get('message')}")


class WorkflowCancelled(WorkflowError):
    """Raised by `result()` of an execution that was cancelled; `reason` is the one given, or None."""

    def __init__(self, execution_id: str, reason: Optional[str]):
        self.execution_id = execution_id
        self.reason = reason
        super().__init__(f"execution {execution_id!r} was cancelled" + (f": {reason}" if reason else ""))


class StepFailed(WorkflowError):
    """Raised into a workflow when a step failed for good (not retryable, or retries exhausted).

    `error_type` and `error_message` are those of the step's last error; `attempts` how many
    attempts were made.
    """

    def __init__(self, step_key: str, error_type: str, error_message: str, attempts: int,
                 traceback: Optional[str] = None):
        super().__init__(f"step {step_key!r} failed after {attempts} attempt(s): {error_type}: {error_message}")
        self.step_key = step_key
        self.error_type = error_type
        self.error_message = error_message
        self.attempts = attempts
        self.traceback = traceback


class StepTimeout(WorkflowError):
    """Raised when a step attempt runs past its `timeout=`: it is recorded as the attempt's error
    (type "StepTimeout") and retried by the step's policy; once attempts run out, the workflow
    receives `StepFailed` with `error_type == "StepTimeout"`."""

    def __init__(self, step_key: str, attempt: int, timeout: float):
        super().__init__(f"step {step_key!r} attempt {attempt} did not end within its timeout of {timeout:g} s")
        self.step_key = step_key
        self.attempt = attempt
        self.timeout = timeout


class WorkflowStuck(WorkflowError):
    """Raised when an in-process run (`worker.testing`) can make no progress: the execution waits
    for nothing due, or the ledger is unusable."""


class DeliveryEnded(YieldstarError, RuntimeError):
    """Raised when a workflow's `ctx` is used after its delivery ended: kept in a global and used by
    a later delivery, or used from a thread or task that outlived its step or its workflow
    function. Nothing was written, and nothing of the context changed.

    A misuse of an object past its life, like a closed file's, and not a step's outcome: it is
    neither a `WorkflowError` (no workflow or step ended by it) nor an `InvalidArgument` (every
    argument may be right). A `RuntimeError`, as asyncio's "Event loop is closed" is.
    """

    def __init__(self, execution_id: str, token: int):
        super().__init__(f"the delivery of execution {execution_id!r} under token {token} has ended, so its ctx can"
                         " no longer be used (nothing was written): don't keep a ctx beyond its workflow function,"
                         " or use it from threads or tasks that outlive the step")
        self.execution_id = execution_id
        self.token = token


class AppError(YieldstarError):
    """Raised when the user's app (the module or file that registers workflows) cannot be used."""


class AppNotFound(AppError):
    """Raised when an APP module name or .py path cannot be imported."""


class AppLoadFailed(AppError):
    """Raised when a child process cannot import the user's app.

    The message's first line says what failed ("cannot load app APP: CAUSE"); the lines after
    it, if any, are the child's traceback, kept apart in `details` so that the command line can
    print one line, and the whole of it only when asked (`supervise --verbose`)."""

    def __init__(self, text: str):
        summary, _, self.details = text.partition("\n")
        super().__init__(summary)


class DiedWhileStarting(AppLoadFailed):
    """Raised when child processes keep ending before they report whether they loaded the app."""


class LedgerInUse(YieldstarError):
    """Raised when an operation that needs the ledger to itself (a restore) finds processes using it."""


class StorageError(YieldstarError):
    """Raised when the ledger's storage failed a call; the call's transaction was rolled back."""

    #: A short name of the kind of failure, for logs and for a delivery's `Retry` reply.
    kind = "storage"
    #: True when the same call may succeed later without anyone acting.
    transient = True


class StorageBusy(StorageError):
    """Raised when the database stayed locked by another process past the busy timeout."""

    kind = "busy"


class StorageUnavailable(StorageError):
    """Raised when the storage failed for a reason that may pass: disk full, I/O error, no memory."""

    kind = "unavailable"


class LedgerUnusable(StorageError):
    """Raised when the ledger cannot be used until an operator acts (the message says how)."""

    kind = "unusable"
    transient = False


class StorageCorrupt(LedgerUnusable):
    """Raised when the database file is damaged (SQLite: 'database disk image is malformed')."""

    kind = "corrupt"


class NotALedger(LedgerUnusable):
    """Raised when the file is not a database, or a database that is not a Yieldstar ledger."""

    kind = "not_a_ledger"


class SchemaTooNew(LedgerUnusable):
    """Raised when the database was written by a newer Yieldstar than this one."""

    kind = "schema_too_new"


class UnsafeLedgerFile(LedgerUnusable):
    """Raised when the ledger, its -wal or its -shm is a symlink, owned by another user, or
    readable or writable by others; nothing was written to it."""

    kind = "unsafe_file"


class NoLedger(LedgerUnusable):
    """Raised when there is no ledger at the path and the caller asked not to create one."""

    kind = "no_ledger"


class LedgerGone(LedgerUnusable):
    """Raised when the ledger file or its -wal or -shm was deleted or replaced, the ledger's database
    is a read-only standby or was dropped, or this process may no longer write the ledger."""

    kind = "gone"


#: The kinds of storage error worth retrying (`StorageError.kind` of the transient branches).
TRANSIENT_KINDS = frozenset(cls.kind for cls in (StorageError, StorageBusy, StorageUnavailable))
