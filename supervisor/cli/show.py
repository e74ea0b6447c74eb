"""Commands that look at executions: `get`, `ls`, `steps`, `history`, and `wake`."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..values import ExecutionStatus
from . import (
    EXIT_UNKNOWN,
    as_json,
    backend_of,
    fail,
    handles_errors,
    main,
)


@main.command()
@click.argument("execution_id", metavar="ID")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON object.")
@click.pass_context
@handles_errors
def get(ctx, execution_id: str, as_json_: bool) -> None:
    """Show one execution."""
    with backend_of(ctx, create=False) as backend:
        record = backend.executions.get(execution_id)
    if record is None:
        fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
    if as_json_:
        click.echo(json.dumps(as_json(record)))
        return
    for key, value in as_json(record).items():
        click.echo(f"{key:<26} {json.dumps(value) if isinstance(value, (dict, list)) else value}")


@main.command(name="ls")
@click.option("--status", type=click.Choice([s.value for s in ExecutionStatus]), help="Only executions in this status.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most this many.")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def list_executions(ctx, status: str | None, limit: int | None, as_json_: bool) -> None:
    """List executions, newest first."""
    with backend_of(ctx, create=False) as backend:
        records = backend.executions.list(status=status, limit=limit)
    if as_json_:
        click.echo(json.dumps([as_json(r) for r in records]))
        return
    for r in records:
        click.echo(f"{r.execution_id}\t{r.workflow}\t{r.status}\ttoken={r.token}"
                   f"\tunacknowledged={r.unacknowledged_deliveries}")


@main.command()
@click.argument("execution_id", metavar="ID")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def steps(ctx, execution_id: str, as_json_: bool) -> None:
    """Show the recorded steps of one execution, in the order written."""
    with backend_of(ctx, create=False) as backend:
        if backend.executions.get(execution_id) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        records = backend.heap.steps(execution_id)
    if as_json_:
        click.echo(json.dumps([as_json(r) for r in records]))
        return
    for r in records:
        click.echo(f"{r.step_key}\tattempt={r.attempt}\tdone={str(r.done).lower()}\t{r.step_response_json}")


@main.command()
@click.argument("execution_id", metavar="ID")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def history(ctx, execution_id: str, as_json_: bool) -> None:
    """Show the lease history of one execution: one row per delivery."""
    with backend_of(ctx, create=False) as backend:
        if backend.executions.get(execution_id) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        records = backend.executions.history(execution_id)
    if as_json_:
        click.echo(json.dumps([asdict(r) for r in records]))
        return
    for r in records:
        click.echo(f"token={r.token}\tholder={r.holder}\tclaimed_at={r.claimed_at}\texpires_at={r.expires_at}"
                   f"\trenewals={r.renewals}\tended={r.ended_by or 'live'}"
                   + (f"\toutcome={r.outcome}" if r.outcome else ""))


@main.command()
@click.argument("execution_id", metavar="ID")
@click.option("--at", type=int, default=None, help="When, in ms since the epoch (default: now).")
@click.pass_context
@handles_errors
def wake(ctx, execution_id: str, at: int | None) -> None:
    """Request a wake of one execution."""
    with backend_of(ctx, create=False) as backend:
        backend.executions.request_wake(execution_id, backend.clock() if at is None else at)


