"""Live supervisors (SPEC section 11): every statement for the `supervisors` table.

A supervisor registers when it knows which workflows it serves (its first worker loaded the app),
is seen again at every renewal round, and removes its row when it exits cleanly:

    register(id, ...)  -> its row, and the rows of supervisors no longer live are dropped
    seen(id)           -> last_seen_at = now; False when its row is gone (dropped while it was
                          paused longer than three intervals): it registers again
    remove(id)         -> at a clean exit
    live()             -> the rows seen within three of their own renewal intervals

A supervisor that is killed leaves its row behind; the row stops being live three renewal
intervals after it was last seen, and the next registration drops it. Each row carries its own
renewal interval (`renew_ms`), so a reader judges every supervisor by its own rhythm, whatever
its own is. The table is a hint for operators and for routing's "served" question: nothing that
decides whose writes count reads it, so a row missing for a while (its storage failed) costs a
wrong "not served" for a moment, never a lost or repeated step.
"""

from __future__ import annotations

import json

from .. import arguments
from ..contract import SupervisorClient
from ..errors import InvalidArgument
from ..values import LIVE_INTERVALS, SupervisorRecord
from .clocked import ClockedTable

COLUMNS = "supervisor_id, host, pid, started_at, last_seen_at, workflows_json, concurrency, workers, renew_ms"
REGISTER = f"""
INSERT INTO supervisors ({COLUMNS}) VALUES ($p, $p, $p, $p, $p, $p, $p, $p, $p)
ON CONFLICT (supervisor_id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
    last_seen_at = excluded.last_seen_at, workflows_json = excluded.workflows_json,
    concurrency = excluded.concurrency, workers = excluded.workers, renew_ms = excluded.renew_ms
RETURNING {COLUMNS}"""
# Rows of supervisors no longer live: killed, or their host cut off. A few at most.
DROP_GONE = f"DELETE FROM supervisors WHERE last_seen_at + {LIVE_INTERVALS} * renew_ms <= $p"
SEEN = "UPDATE supervisors SET last_seen_at = $p WHERE supervisor_id = $p"
REMOVE = "DELETE FROM supervisors WHERE supervisor_id = $p"
LIVE = f"""
SELECT {COLUMNS} FROM supervisors WHERE last_seen_at + {LIVE_INTERVALS} * renew_ms > $p
ORDER BY started_at, supervisor_id"""


def _record(row: tuple) -> SupervisorRecord:
    sid, host, pid, started, seen, workflows_json, concurrency, workers, renew_ms = row
    return SupervisorRecord(id=sid, host=host, pid=pid, started_at=started, last_seen_at=seen,
                            workflows=tuple(json.loads(workflows_json)), concurrency=concurrency,
                            workers=workers, renew_ms=renew_ms)


class SupervisorTable(ClockedTable, SupervisorClient):

    def register(self, supervisor_id, *, host, pid, workflows, concurrency, workers, renew_ms, started_at=None,
                 now=None) -> SupervisorRecord:
        arguments.identifier("supervisor_id", supervisor_id)
        arguments.identifier("host", host)
        arguments.integer("pid", pid, minimum=1)
        served = arguments.workflows("workflows", workflows)
        if served is None:
            raise InvalidArgument("workflows must be a collection of workflow names, not None")
        arguments.integer("concurrency", concurrency, minimum=1)
        arguments.integer("workers", workers, minimum=1)
        arguments.integer("renew_ms", renew_ms, minimum=1)
        now = self._now(now)
        started = now if started_at is None else arguments.integer("started_at", started_at)
        row = (supervisor_id, host, pid, started, now, json.dumps(sorted(served)), concurrency, workers, renew_ms)
        with self._conn.write() as db:
            db.execute(self._sql[DROP_GONE], (now,))
            stored = db.execute(self._sql[REGISTER], row).fetchone()
        return _record(stored)  # its start kept, when it was registered already

    def seen(self, supervisor_id, *, now=None) -> bool:
        arguments.identifier("supervisor_id", supervisor_id)
        now = self._now(now)
        return self._conn.execute(self._sql[SEEN], (now, supervisor_id)).rowcount == 1

    def remove(self, supervisor_id) -> None:
        arguments.identifier("supervisor_id", supervisor_id)
        self._conn.execute(self._sql[REMOVE], (supervisor_id,))

    def live(self, *, now=None) -> list[SupervisorRecord]:
        now = self._now(now)
        return [_record(row) for row in self._conn.execute(self._sql[LIVE], (now,)).fetchall()]

    def served(self, *, now=None) -> set[str]:
        return {name for record in self.live(now=now) for name in record.workflows}
