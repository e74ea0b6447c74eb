"""What the UI reads from the ledger, and the JSON it serves under `/api/`.

Every read is the one the matching CLI command makes (`ls`, `get` with `steps` and `history`,
`queues`, `schedules`, `supervisors`), and every JSON shape is that command's `--json`, so a
script that reads one reads the other. Query parameters are checked here as the CLI checks its
options: a bad one raises `InvalidArgument` naming the parameter, before anything is read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from ..cli.payloads import json_object
from ..cli.queues import queue_json
from ..cli.schedules import schedule_json
from ..cli.supervisors import supervisor_json
from ..humane import parse_time
from ..ledger import arguments
from ..ledger.errors import InvalidArgument
from ..ledger.values import ExecutionRecord, ExecutionStatus, HeapRecord, LeaseRecord, WaitReason

# A page of executions when the query names no limit: enough to scan, quick to draw.
PAGE = 50
# The largest limit or offset: what both databases' 64-bit integers hold with room to spare.
LARGEST = 2 ** 62


@dataclass(frozen=True)
class Filters:
    """The `ls` filters, from a query string (`?status=failed&since=1h&limit=20`)."""

    status: Optional[str] = None
    workflow: Optional[str] = None
    since: Optional[str] = None
    until: Optional[str] = None
    id_prefix: Optional[str] = None
    limit: int = PAGE
    offset: int = 0

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> "Filters":
        """The filters a query names; an empty field (as an HTML form sends it) is no filter.

        Raises:
            InvalidArgument: a value is not valid (the message names the parameter).
        """
        given = {name: query[name].strip() for name in ("status", "workflow", "since", "until", "id_prefix",
                                                       "limit", "offset") if query.get(name, "").strip()}
        status = given.get("status")
        if status is not None and status not in {s.value for s in ExecutionStatus}:
            raise InvalidArgument(f"status {status!r} is not one of " + ", ".join(s.value for s in ExecutionStatus))
        for name in ("workflow", "id_prefix"):
            if name in given:
                arguments.identifier(name, given[name])
        return cls(status=status, workflow=given.get("workflow"), since=given.get("since"), until=given.get("until"),
                   id_prefix=given.get("id_prefix"), limit=_count("limit", given.get("limit"), PAGE),
                   offset=_count("offset", given.get("offset"), 0))

    def query(self, **changes) -> dict:
        """These filters (with `changes`) as query parameters, for a link to another page."""
        fields = {**asdict(self), **changes}
        return {name: value for name, value in fields.items() if value is not None}


def _count(name: str, text: Optional[str], default: int) -> int:
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or int(text) > LARGEST:
        raise InvalidArgument(f"{name} {text!r} is not a whole number from 0 to {LARGEST}")
    return int(text)


def read_executions(backend, filters: Filters) -> tuple[int, list[ExecutionRecord]]:
    """The time of the read, and the executions `ls` lists with these filters, newest first."""
    now = backend.clock()
    try:
        since = None if filters.since is None else parse_time(filters.since, now=now, option="since")
        until = None if filters.until is None else parse_time(filters.until, now=now, option="until")
    except ValueError as exc:  # the message names the parameter
        raise InvalidArgument(str(exc)) from None
    records = backend.executions.list(status=filters.status, workflow=filters.workflow, id_prefix=filters.id_prefix,
                                      since=since, until=until, limit=filters.limit, offset=filters.offset, now=now)
    return now, records


def executions_json(records: list[ExecutionRecord]) -> str:
    """As `ls --json` prints them."""
    return "[" + ", ".join(json_object(r) for r in records) + "]"


@dataclass(frozen=True)
class ExecutionView:
    """One execution as its page shows it: `get`'s record, waits and served flag, `steps`' steps
    and `history`'s deliveries, all as of `now`."""

    now: int
    record: ExecutionRecord
    waiting: list[WaitReason]
    served: bool
    steps: list[HeapRecord]
    history: list[LeaseRecord]


def read_execution(backend, execution_id: str) -> Optional[ExecutionView]:
    """The execution's view, or None if it was never admitted."""
    arguments.identifier("execution_id", execution_id)
    now = backend.clock()
    record = backend.executions.get(execution_id, now=now)
    if record is None:
        return None
    return ExecutionView(now=now, record=record, waiting=backend.executions.waiting_for(execution_id, now=now),
                         served=record.workflow in backend.supervisors.served(now=now),
                         steps=backend.heap.steps(execution_id),
                         history=backend.executions.history(execution_id, now=now))


def execution_json(view: ExecutionView) -> str:
    """`{"execution": get --json, "steps": steps --json, "history": history --json, "now": ms}`:
    the record carries `waiting_for` and `served` as `get --json` does."""
    execution = json_object(view.record, waiting_for=[asdict(w) for w in view.waiting], served=view.served)
    steps = "[" + ", ".join(json_object(s) for s in view.steps) + "]"
    return (f'{{"execution": {execution}, "steps": {steps}, "history": {json.dumps([asdict(r) for r in view.history])},'
            f' "now": {view.now}}}')


def read_queues(backend) -> tuple[int, list]:
    return backend.clock(), backend.queues.list()


def queues_json(queues: list) -> str:
    """As `queues --json` prints them."""
    return json.dumps([queue_json(q) for q in queues])


def read_schedules(backend) -> tuple[int, list]:
    return backend.clock(), backend.schedules.list()


def schedules_json(schedules: list) -> str:
    """As `schedules --json` prints them."""
    return json.dumps([schedule_json(r) for r in schedules])


def read_supervisors(backend) -> tuple[int, list]:
    now = backend.clock()
    return now, backend.supervisors.live(now=now)


def supervisors_json(live: list) -> str:
    """As `supervisors --json` prints them."""
    return json.dumps([supervisor_json(s) for s in live])
