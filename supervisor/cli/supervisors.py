"""`yieldstar supervisors`: the live supervisors (SPEC section 11), and the workflows each serves.

A supervisor is live while it was seen within three of its own renewal intervals; one that was
killed drops out of the list that long after it was last seen. A read, never a write.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..humane import format_duration, format_time
from . import backend_of, handles_errors, main
from .show import aligned


@main.command()
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def supervisors(ctx, as_json_: bool) -> None:
    """List the live supervisors: where each runs, since when, and the workflows it serves."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        live = backend.supervisors.live(now=now)
    if as_json_:
        click.echo(json.dumps([supervisor_json(s) for s in live]))
        return
    if not live:
        click.echo("no live supervisor: nothing is claimed until one runs (yieldstar supervise APP)")
        return
    rows = [("ID", "HOST", "PID", "STARTED", "LAST SEEN", "CONCURRENCY", "WORKERS", "WORKFLOWS")]
    rows += [(s.id, s.host, str(s.pid), format_time(s.started_at, now=now),
              f"{format_duration(max(now - s.last_seen_at, 0))} ago", str(s.concurrency), str(s.workers),
              ", ".join(s.workflows) or "(none)") for s in live]
    click.echo("\n".join(aligned(rows, right=(2, 5, 6))))


def supervisor_json(record) -> dict:
    """A live supervisor (`SupervisorRecord`) as `supervisors --json` prints it."""
    return {**asdict(record), "workflows": list(record.workflows)}
