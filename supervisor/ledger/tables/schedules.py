"""The workflows' schedules (SPEC section 12): every statement for the `schedules` table.

One row per schedule, kept by every supervisor that serves its workflow:

    name        the workflow                 last_tick   the latest tick admitted (ms), NULL before
    spec        cron expression, or          next_tick   the first tick not yet due: the cursor,
                "every S s"                              NULL for a cron that matches nothing
    timezone    the cron's zone, NULL: UTC   updated_at  the ledger time of its last change

`admit_due` is the whole protocol, in one write transaction per call:

    row missing           -> inserted, next_tick = first tick at or after now (nothing missed)
    spec or zone changed  -> replaced, next_tick = first tick at or after now, after last_tick
    next_tick <= now      -> tick = latest tick <= now (the ones missed meanwhile are skipped);
                             UPDATE ... WHERE name = ? AND next_tick = <as read> (compare-and-set)
                             and, only if that changed the row, the execution `name@tick` admitted
                             in the same transaction (idempotent by id, like any admit)

The compare-and-set is what makes two supervisors agree: on SQLite the write lock serializes
them anyway; on PostgreSQL the row is read `FOR UPDATE`, and the loser of a race reads the
winner's row and admits nothing. Since `last_tick` only moves forward, a tick whose execution was
purged is never admitted again. The execution is admitted with the ledger's `insert` of
`execution_rows`, so it is an execution like any other (and is announced as due, as an admit is).
"""

from __future__ import annotations

import json
from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import ScheduleClient
from ..errors import InvalidArgument
from ..ticks import Schedule, latest_tick, next_tick, tick_id, tick_input
from ..values import ScheduleRecord
from ..values import WORKFLOWS_TIMEOUT
from .execution_rows import insert
from .clocked import ClockedTable

COLUMNS = "name, spec, timezone, last_tick, next_tick, updated_at"
SELECT_ONE = f"SELECT {COLUMNS} FROM schedules WHERE name = $p $for_update"
SELECT_ALL = f"SELECT {COLUMNS} FROM schedules ORDER BY name"
# A new schedule: a concurrent caller may have inserted it first (then its row is read again).
INSERT_NEW = f"""
INSERT INTO schedules ({COLUMNS}) VALUES ($p, $p, $p, NULL, $p, $p)
ON CONFLICT (name) DO NOTHING"""
# The app's schedule changed: the cursor starts again from now, keeping the last tick admitted.
REPLACE = "UPDATE schedules SET spec = $p, timezone = $p, next_tick = $p, updated_at = $p WHERE name = $p"
# The compare-and-set: advance only from the next tick this caller read.
# A workflow its app no longer schedules: the latest supervisor to start says so.
FORGET = "DELETE FROM schedules WHERE name = $p"
ADVANCE = """
UPDATE schedules SET last_tick = $p, next_tick = $p, updated_at = $p
WHERE name = $p AND next_tick = $p"""


def _record(row: tuple, admitted: bool = False) -> ScheduleRecord:
    name, spec, zone, last, upcoming, updated = row
    return ScheduleRecord(name=name, spec=spec, timezone=zone, last_tick=last, next_tick=upcoming,
                          updated_at=updated, admitted=admitted)


def first_at_or_after(schedule: Schedule, at_ms: int, after: Optional[int] = None) -> Optional[int]:
    """The first tick at or after `at_ms` (and strictly after `after`, when given)."""
    start = at_ms - 1 if after is None else max(at_ms - 1, after)
    return next_tick(schedule, start)


class ScheduleTable(ClockedTable, ScheduleClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], on_due: Callable[[], None]):
        super().__init__(conn, clock)
        self._on_due = on_due

    def admit_due(self, schedules, *, now=None) -> list[ScheduleRecord]:
        iterable = isinstance(schedules, (list, tuple, set, frozenset))
        schedules = list(schedules) if iterable else None
        if schedules is None or not all(isinstance(each, Schedule) for each in schedules):
            raise InvalidArgument("schedules must be a collection of Schedule values")
        now = self._now(now)
        out: list[ScheduleRecord] = []
        admitted_any = False
        with self._conn.write() as db:
            for schedule in schedules:
                record = self._admit_due(db, schedule, now)
                admitted_any = admitted_any or record.admitted
                out.append(record)
        if admitted_any:
            self._on_due()
        return out

    def _admit_due(self, db, schedule: Schedule, now: int) -> ScheduleRecord:
        sql = self._sql
        name, spec = schedule.workflow, schedule.spec
        row = db.execute(sql[SELECT_ONE], (name,)).fetchone()
        if row is None:
            db.execute(sql[INSERT_NEW], (name, spec, schedule.timezone, first_at_or_after(schedule, now), now))
            row = db.execute(sql[SELECT_ONE], (name,)).fetchone()
        if (row[1], row[2]) != (spec, schedule.timezone):
            upcoming = first_at_or_after(schedule, now, after=row[3])
            db.execute(sql[REPLACE], (spec, schedule.timezone, upcoming, now, name))
            row = (name, spec, schedule.timezone, row[3], upcoming, now)
        expected = row[4]
        if expected is None or expected > now:
            return _record(row)
        tick = latest_tick(schedule, now)
        if tick is None or (row[3] is not None and tick <= row[3]):  # cannot be, short of a changed clock
            return _record(row)
        upcoming = next_tick(schedule, now)
        if db.execute(sql[ADVANCE], (tick, upcoming, now, name, expected)).rowcount != 1:
            return _record(db.execute(sql[SELECT_ONE], (name,)).fetchone())  # another caller advanced it
        # A tick goes to its workflow's default queue, priority and timeout, as a child start does.
        insert(db, sql, tick_id(name, tick), name, json.dumps(tick_input(tick)), now, queue=None, key=None,
               priority=None, take_turns=not self._conn.whole_database_write_lock, timeout_ms=WORKFLOWS_TIMEOUT)
        return _record((name, spec, schedule.timezone, tick, upcoming, now), admitted=True)

    def forget(self, workflows) -> int:
        names = arguments.workflows("workflows", workflows)
        if names is None:
            raise InvalidArgument("workflows must be a collection of workflow names, not None")
        with self._conn.write() as db:
            return sum(db.execute(self._sql[FORGET], (name,)).rowcount for name in sorted(names))

    def list(self) -> list[ScheduleRecord]:
        return [_record(row) for row in self._conn.execute(self._sql[SELECT_ALL]).fetchall()]
