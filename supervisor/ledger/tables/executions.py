"""The executions client, written once for both backends: `ExecutionTable`.

It does four jobs, one module each, as the contract's `ExecutionClient` lists them:

    leases.ExecutionLeases          the lease state machine: admit, get, wakes, claims, renewals,
                                    releases, acknowledgements (alone or a batch with a claim)
    operators.ExecutionOperators    the operators' queries: list, stats, waiting_for, history,
                                    cancel, resume, unpark, purge
    deadlines.ExecutionDeadlines    the workflow timeout: executions past their deadline failed
    forks.ExecutionForks            a fork: a new execution with a copy of the first of its steps

Both build on `execution_rows.ExecutionRows` (the client's state, and how a stored row reads as
of a time, is stamped and is woken), and both write the lease history through `lease_history`.

They are mixins of one class, not two objects behind a facade: the halves share one state (the
connection, the clock, the announcements, the last claim's finding) and a few steps (`wake_in`
runs in a cancel and in a batch of acknowledgements), and a backend overrides a step of either
half by subclassing (`supervisor.ledger.postgres.executions`), which a facade would have to
forward method by method.
"""

from __future__ import annotations

from ..contract import ExecutionClient
from .deadlines import ExecutionDeadlines
from .forks import ExecutionForks
from .leases import ExecutionLeases, renewal_lock_wait_ms
from .operators import ExecutionOperators

__all__ = ["ExecutionTable", "renewal_lock_wait_ms"]


class ExecutionTable(ExecutionLeases, ExecutionOperators, ExecutionDeadlines, ExecutionForks, ExecutionClient):
    """The executions client on a backend's connection (see the module docstring)."""
