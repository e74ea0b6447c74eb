"""A durable timer the ledger cannot hold (before 1970, or after the year 9999) is refused with
`InvalidArgument` naming the argument, before its step is recorded."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from worker import InvalidArgument, Registry
from worker.testing import run_workflow

registry = Registry()
TIMERS = {
    "seconds 1e13": lambda ctx: ctx.sleep("s", 1e13),
    "when 1e12": lambda ctx: ctx.sleep_until("s", 1e12),
    "when before 1970": lambda ctx: ctx.sleep_until("s", datetime(1969, 12, 31, tzinfo=timezone.utc)),
}


@registry.workflow("t.timer")
def timer(ctx, input):
    try:
        TIMERS[input](ctx)
    except InvalidArgument as exc:
        return str(exc)
    return "accepted"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(TIMERS))
def test_a_timer_the_ledger_cannot_hold_is_refused_naming_it_and_records_nothing(sqlite_backend, clock, case):
    record = run_workflow(registry, "t.timer", case, backend=sqlite_backend, clock=clock)
    message = json.loads(record.result_json)
    assert message.startswith(case.split()[0] + " ") and "the ledger" in message, message
    assert sqlite_backend.heap.steps("test-execution") == []
