"""The ledger's tables, written once for both backends.

Each module holds the statements of its tables and the logic of its client:

    executions       the executions client, `ExecutionTable`, composed of two halves:
      leases           the lease state machine (admit, wakes, claims, renewals, releases,
                       acknowledgements: `acknowledgements` is one as a value)
      operators        the operators' queries (list, stats, waiting_for, history, cancel,
                       resume, unpark, purge)
      parking          a diverged execution parked: its `code` registration in `waiters`
      execution_rows   what both halves share: the row, its statuses, how it reads as of a time
    lease_history    every statement for the lease history
    heap, starts, effects, stores, and the `waiters` they share; `epochs`.
    messages, events  talking to a running execution (SPEC section 14)
    supervisors      the live supervisors (routing: who serves which workflows)
    schedules        the workflows' schedules: each tick admitted once (SPEC section 12)

Each statement is a module-level template, written once for both backends: plain SQL where the
databases agree and a named fragment where they differ (`$p` for a parameter, `$for_update`,
`$row_order`...: `supervisor.ledger.dialect`). A client runs `self._sql[TEMPLATE]`, the
backend's form of it, rendered by its connection's `dialect` the first time and kept, so both
backends follow one set of rules and give the same replies and errors. A backend may make some
steps of a table its own (`LedgerTables.execution_table`): PostgreSQL makes a batch of
acknowledgements and a claim one round trip (`supervisor.ledger.postgres.executions`).
`LedgerTables` is what every backend shares: the table clients on the backend's connection, its
checked clock and closing.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..contract import Backend
from ..errors import InvalidArgument
from .effects import EffectTable
from .events import EventTable
from .executions import ExecutionTable
from .heap import HeapTable
from .messages import MessageTable
from .queues import QueueTable
from .starts import StartTable
from .stores import StoreTable
from .schedules import ScheduleTable
from .supervisors import SupervisorTable


def default_redelivery_delay(n: int) -> int:
    """1 s after the first unacknowledged delivery, doubling each time, at most 5 minutes."""
    return min(1000 * 2 ** min(n - 1, 30), 300_000)


# How far a user's redelivery_delay is checked up front for being positive and non-decreasing.
CHECKED_DELAYS = 64


def checked_delay(fn: Callable[[int], int]) -> Callable[[int], int]:
    if not callable(fn):
        raise InvalidArgument(f"redelivery_delay must be callable, not {type(fn).__name__}")
    previous = 0
    for n in range(1, CHECKED_DELAYS + 1):
        value = fn(n)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgument(f"redelivery_delay({n}) must be an int > 0 ms, got {value!r}")
        if value < previous:
            raise InvalidArgument(
                f"redelivery_delay must not decrease: redelivery_delay({n}) = {value} < redelivery_delay({n - 1}) = {previous}"
            )
        previous = value

    def delay(n: int) -> int:
        return fn(n) if n <= CHECKED_DELAYS else max(fn(n), previous)

    return delay


class LedgerTables(Backend):
    """The part of a `Backend` every backend shares: the ledger's table clients (the modules of this package) on the
    backend's connection, its checked clock, and closing. A backend sets `self.clock`,
    `self.redelivery_delay`, `self.max_payload_bytes` and `self._conn`, then calls
    `_open_tables()`, and says how it announces work that became due and executions that ended."""

    #: Every process's clock estimates one shared clock (the server's), a little behind it by an
    #: amount each process has its own of: see `ExecutionTable(one_clock=)`.
    one_clock = False
    #: The executions table's class: the shared one, or a backend's own form of some of its steps.
    execution_table = ExecutionTable

    def _open_tables(self) -> None:
        announce = self._announce_due
        limit = self.max_payload_bytes
        self.executions = self.execution_table(self._conn, self._clock, self.redelivery_delay, on_due=announce,
                                               on_ended=self._announce_ended, one_clock=self.one_clock,
                                               max_payload_bytes=limit)
        self.heap = HeapTable(self._conn, self._clock, one_clock=self.one_clock, max_payload_bytes=limit)
        self.starts = StartTable(self._conn, self._clock, on_due=announce, max_payload_bytes=limit)
        self.effects = EffectTable(self._conn, self._clock, self.executions, on_due=announce, max_payload_bytes=limit)
        self.stores = StoreTable(self._conn, self._clock, self.executions, on_due=announce, max_payload_bytes=limit)
        self.messages = MessageTable(self._conn, self._clock, self.executions, on_due=announce,
                                     max_payload_bytes=limit)
        self.events = EventTable(self._conn, self._clock, self._announce_ended, max_payload_bytes=limit)
        self.supervisors = SupervisorTable(self._conn, self._clock)
        self.schedules = ScheduleTable(self._conn, self._clock, on_due=announce)
        self.queues = QueueTable(self._conn, self._clock)

    def _announce_due(self) -> None:
        raise NotImplementedError

    def _announce_ended(self, execution_ids: list[str]) -> None:
        raise NotImplementedError

    def _clock(self) -> int:
        return arguments.integer("clock()", self.clock())

    def spot_twin(self) -> Optional["LedgerTables"]:
        """None: by default a backend has no twin for calls on the spot (see `Backend.spot_twin`)."""
        return None

    def check_files(self) -> None:
        """Nothing: by default a backend keeps no files of its own (see `Backend.check_files`)."""

    @property
    def connection(self):
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"
