"""`yieldstar schedules`: the workflows' schedules (SPEC section 12), each with its last and next
tick. A read, never a write; a schedule is listed once a supervisor that serves its workflow has
recorded it.

`--json` keys are `ScheduleRecord`'s fields (`name`, `spec`, `timezone`, `last_tick`,
`next_tick`, `updated_at`: times in ms since the epoch, as every ledger time), and `last_id`, the
execution id of the last tick admitted (null before the first).
"""

from __future__ import annotations

import json

import click

from ..humane import relative
from ..ledger.ticks import tick_id, tick_text
from . import backend_of, handles_errors, main
from .show import aligned


@main.command()
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def schedules(ctx, as_json_: bool) -> None:
    """List the schedules: each with its spec, time zone, last tick admitted and next tick."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        records = backend.schedules.list()
    if as_json_:
        click.echo(json.dumps([schedule_json(r) for r in records]))
        return
    if not records:
        click.echo("no schedule recorded: a supervisor records its app's schedules when it starts")
        return
    rows = [("WORKFLOW", "SPEC", "TIME ZONE", "LAST TICK", "NEXT TICK")]
    rows += [(r.name, r.spec, r.timezone or "UTC",
              "-" if r.last_tick is None else tick_text(r.last_tick),
              "never" if r.next_tick is None else f"{tick_text(r.next_tick)} ({relative(r.next_tick, now)})")
             for r in records]
    click.echo("\n".join(aligned(rows)))


def schedule_json(record) -> dict:
    """A schedule (`ScheduleRecord`) as `schedules --json` prints it (see the module docstring)."""
    return {"name": record.name, "spec": record.spec, "timezone": record.timezone, "last_tick": record.last_tick,
            "next_tick": record.next_tick, "updated_at": record.updated_at,
            "last_id": None if record.last_tick is None else tick_id(record.name, record.last_tick)}
