"""Commands that act on executions: `cancel`, `resume`, `purge` (SPEC section 8), and `fork`
(section 14)."""

from __future__ import annotations

import click

from worker.client import Client

from ..ledger.arguments import MAX_TIME_MS
from ..ledger.errors import ExecutionConflict, UnknownExecution, UnknownStep, fork_id_taken
from ..ledger.values import TERMINAL_STATUSES
from . import EXIT_UNKNOWN, backend_of, fail, handles_errors, ledger_of, main, params
from .submit import note_unserved


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--reason", default=None, help="Why: recorded as the message of the execution's error.")
@click.pass_context
@handles_errors
def cancel(ctx, execution_id: str, reason: str | None) -> None:
    """Cancel an execution: it becomes terminal, and a running delivery of it is stopped."""
    with backend_of(ctx, create=False) as backend:
        found = backend.executions.get(execution_id)
        if found is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        before = found.status
        record = backend.executions.cancel(execution_id, reason=reason)
    if before in TERMINAL_STATUSES:
        click.echo(f"{execution_id} was already {record.status}; nothing changed")
    else:
        click.echo(f"{execution_id} cancelled (it was {before})")


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.pass_context
@handles_errors
def resume(ctx, execution_id: str) -> None:
    """Run a failed or cancelled execution again from where it stopped, or try a parked one (its
    replay diverged) with the code now deployed: its recorded steps are kept."""
    with backend_of(ctx, create=False) as backend:
        if backend.executions.get(execution_id) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        record = backend.executions.resume(execution_id)
    click.echo(f"{execution_id} resumed: {record.status}, due now")


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--from-step", "from_step", required=True, metavar="KEY", callback=params.identifier,
              help="The recorded step to run again from (yieldstar steps ID lists them): the steps before it are"
                   " copied, it and those after run again.")
@click.option("--id", "new_id", callback=params.identifier,
              help="The new execution's id, which no execution may have (default: a new id).")
@click.pass_context
@handles_errors
def fork(ctx, execution_id: str, from_step: str, new_id: str | None) -> None:
    """Admit a new execution of ID's workflow and input that runs again from its step KEY, and
    print its id. Its recorded steps are copies of ID's up to, not including, KEY; ID is
    unchanged. An unknown execution exits 1; a step ID has not recorded, or an --id that is
    taken, exits 2 and writes nothing."""
    with Client(ledger_of(ctx), create=False) as client:
        try:
            handle = client.fork(execution_id, from_step=from_step, id=new_id)
        except UnknownExecution:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        except UnknownStep as exc:
            fail(str(UnknownStep("--from-step", exc.execution_id, exc.step_key, exc.recorded)))
        except ExecutionConflict:
            fail(str(fork_id_taken("--id", new_id)))
    click.echo(handle.execution_id)
    note_unserved(ctx, handle.workflow)


@main.command()
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Only executions last changed longer ago than this (30s, 15m, 2h, 7d).")
@click.option("--status", "statuses", type=click.Choice(TERMINAL_STATUSES), multiple=True,
              help="Only this terminal status (repeatable; default: all three).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.pass_context
@handles_errors
def purge(ctx, older_than: str, statuses: tuple[str, ...], dry_run: bool) -> None:
    """Delete old terminal executions with their steps and lease history, in short batches."""
    from ..humane import parse_duration

    try:
        age_ms = parse_duration(older_than)
    except ValueError as exc:
        fail(f"--older-than: {exc}")
    if age_ms > MAX_TIME_MS:  # before 1970: nothing is that old, and the ledger holds no such time
        fail(f"--older-than {older_than!r} reaches back before 1970; the ledger's times begin there")
    with backend_of(ctx, create=False) as backend:
        count = backend.executions.purge(before=backend.clock() - age_ms, statuses=statuses or TERMINAL_STATUSES,
                                         dry_run=dry_run)
    noun = "execution" if count == 1 else "executions"
    click.echo(f"{count} {noun} {'would be deleted' if dry_run else 'deleted'}")


@main.command()
@click.argument("dest", metavar="DEST", type=click.Path(dir_okay=False), callback=params.not_empty)
@click.pass_context
@handles_errors
def backup(ctx, dest: str) -> None:
    """Copy the ledger into a new file DEST, consistently, while supervisors run (SQLite)."""
    from ..ledger.sqlite.backup import backup as copy

    path = _sqlite_ledger(ctx, "backup", "pg_basebackup or pg_dump")
    size = copy(path, dest)
    click.echo(f"backed up {path} to {dest} ({size:,} bytes)")


@main.command()
@click.argument("src", metavar="SRC", type=click.Path(dir_okay=False), callback=params.not_empty)
@click.pass_context
@handles_errors
def restore(ctx, src: str) -> None:
    """Replace the ledger with the backup SRC; refused while any process uses the ledger (SQLite).

    The ledger's epoch is raised: no fencing token issued before the restore is ever issued
    again, and the deliveries the backup shows running are delivered again."""
    from ..ledger.sqlite.backup import restore as put_back

    path = _sqlite_ledger(ctx, "restore", "the server's own tools; its epoch is raised by itself (docs/postgres.md)")
    epoch = put_back(src, path)
    click.echo(f"restored {path} from {src}: epoch {epoch}; tokens issued before the restore will not be issued"
               f" again, and the deliveries open in the backup will be delivered again")


def _sqlite_ledger(ctx, command: str, instead: str) -> str:
    """The --db path, which `command` needs to be a SQLite file."""
    from ..ledger.backends import is_uri, shown

    path = ctx.obj["db"]
    if is_uri(path):
        raise ValueError(f"{command} is for SQLite ledgers; for the PostgreSQL ledger {shown(path)} use {instead}")
    return path
