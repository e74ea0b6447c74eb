"""`yieldstar queues`: every queue with limits or executions (SPEC section 12), its limits, and its
due, running and waiting counts. A read, never a write."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from . import backend_of, handles_errors, main
from .show import aligned


@main.command()
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def queues(ctx, as_json_: bool) -> None:
    """List the queues: their limits (set by the apps' supervisors) and their executions now."""
    with backend_of(ctx, create=False) as backend:
        found = backend.queues.list()
    if as_json_:
        click.echo(json.dumps([{**asdict(q), "rate": None if q.rate is None else list(q.rate)} for q in found]))
        return
    rows = [("QUEUE", "CONCURRENCY", "PER KEY", "RATE", "DUE", "RUNNING", "WAITING")]
    rows += [(q.name, _limit(q.concurrency), _limit(q.per_key),
              "-" if q.rate is None else f"{q.rate[0]} per {q.rate[1]:g} s", str(q.due), str(q.running), str(q.waiting))
             for q in found]
    click.echo("\n".join(aligned(rows, right=(1, 2, 4, 5, 6))))


def _limit(value) -> str:
    return "-" if value is None else str(value)
