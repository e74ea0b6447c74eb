"""`yieldstar queues`: every queue with limits or executions (SPEC section 12), its limits, and its
due, running and waiting counts. A read, never a write."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..humane import QUEUE_HEADINGS, queue_cells
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
        click.echo(json.dumps([queue_json(q) for q in found]))
        return
    rows = [QUEUE_HEADINGS] + [queue_cells(q) for q in found]
    click.echo("\n".join(aligned(rows, right=(1, 2, 4, 5, 6))))


def queue_json(queue) -> dict:
    """A queue (`QueueRecord`) as `queues --json` and `stats --json` print it."""
    return {**asdict(queue), "rate": None if queue.rate is None else list(queue.rate)}
