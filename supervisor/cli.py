"""The `yieldstar` command line: thin commands over the library (SPEC section 6).

Exit codes: 0 success; 1 the execution asked for is unknown (`get`, `steps`, `history`, `wake`);
2 bad input or a database error (the message says which), printed on stderr without a traceback.
A command that only reads (`get`, `ls`, `steps`, `history`, `store ls`, `store get`), and `wake`,
which needs an execution that exists, never creates a ledger: on a path with no file it prints
"yieldstar: no ledger at PATH" and exits 2, like any other bad `--db`. `supervise` has its own
exit codes (see `supervisor.dispatcher`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import uuid
from dataclasses import asdict
from typing import Any, Callable

import click

from .errors import UnknownExecution, YieldstarError
from .sqlite.backend import open_backend
from .values import ExecutionStatus, SettleConflict

EXIT_UNKNOWN = 1
EXIT_BAD_INPUT = 2


def as_json(record: Any) -> dict:
    """A value object as the JSON the CLI prints: payload fields lose `_json` and are decoded."""
    out = {}
    for key, value in asdict(record).items():
        if key.endswith("_json"):
            out[key[: -len("_json")]] = None if value is None else json.loads(value)
        else:
            out[key] = value
    status = getattr(record, "status", None)
    if status is not None and "status" not in out:
        out["status"] = status
    return out


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"yieldstar: {message}", err=True)
    sys.exit(code)


def handles_errors(fn: Callable) -> Callable:
    """Report library errors as one line on stderr with the documented exit code, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnknownExecution as exc:
            fail(str(exc), EXIT_UNKNOWN)
        except (YieldstarError, ValueError) as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except Exception as exc:  # a bug (storage failures are YieldstarErrors): still one line, no traceback
            fail(f"{type(exc).__name__}: {exc}")

    return wrapper


def backend_of(ctx: click.Context, *, create: bool = True):
    """The ledger named by --db; with `create=False`, a missing one raises `NoLedger`."""
    path = ctx.obj["db"]
    if os.path.isdir(path):
        raise ValueError(f"--db {path} is a folder, not a database file")
    return open_backend(path, create=create)


def parse_json_option(name: str, text: str) -> str:
    try:
        json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from None
    return text


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="YIELDSTAR_DB", default="yieldstar.db", show_default=True,
              help="The ledger file (default: $YIELDSTAR_DB, else ./yieldstar.db).")
@click.pass_context
def main(ctx: click.Context, db: str) -> None:
    """Yieldstar: durable workflows on one host, with execution leases and fencing tokens."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


@main.command()
@click.argument("workflow")
@click.option("--id", "execution_id", help="The execution id; repeating a start with the same id starts nothing.")
@click.option("--input", "input_json", default="null", help="The workflow's input, as JSON.")
@click.pass_context
@handles_errors
def start(ctx, workflow: str, execution_id: str | None, input_json: str) -> None:
    """Admit an execution of WORKFLOW and print its id."""
    parse_json_option("--input", input_json)
    execution_id = execution_id if execution_id is not None else uuid.uuid4().hex
    with backend_of(ctx) as backend:
        record = backend.executions.admit(execution_id, workflow, input_json)
    click.echo(record.execution_id)


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


@main.command()
@click.argument("effect_id")
@click.option("--result", "result_json", required=True, help="The effect's result, as JSON.")
@click.pass_context
@handles_errors
def settle(ctx, effect_id: str, result_json: str) -> None:
    """Settle an effect from outside (an external system finishing its work).

    The first result is kept: settling again with a different one is reported as a conflict
    (exit 2) and changes nothing."""
    parse_json_option("--result", result_json)
    with backend_of(ctx) as backend:
        reply = backend.effects.settle(effect_id, result_json)
    if isinstance(reply, SettleConflict):
        fail(f"effect {effect_id!r} is already settled with {reply.kept_result_json}; {result_json} was not applied")
    click.echo(json.dumps(as_json(reply)))


@main.group()
def store() -> None:
    """Read named stores, and put items into them from outside."""


@store.command(name="ls")
@click.pass_context
@handles_errors
def store_list(ctx) -> None:
    """List every store with its version."""
    with backend_of(ctx, create=False) as backend:
        for state in backend.stores.list():
            click.echo(f"{state.name}\tversion={state.version}\t{state.state_json}")


@store.command(name="get")
@click.argument("name")
@click.pass_context
@handles_errors
def store_get(ctx, name: str) -> None:
    """Print one store's state as JSON; exit 1 if there is no such store."""
    with backend_of(ctx, create=False) as backend:
        state = backend.stores.get(name)
    if state is None:
        fail(f"no store {name!r}", EXIT_UNKNOWN)
    click.echo(state.state_json)


@store.command(name="put")
@click.argument("name")
@click.argument("item_json", metavar="JSON")
@click.pass_context
@handles_errors
def store_put(ctx, name: str, item_json: str) -> None:
    """Append an item to a list store (a mailbox), waking its waiters."""
    parse_json_option("JSON", item_json)
    with backend_of(ctx) as backend:
        click.echo(backend.stores.put(name, item_json).state_json)


@store.command(name="set")
@click.argument("name")
@click.argument("state_json", metavar="JSON")
@click.pass_context
@handles_errors
def store_set(ctx, name: str, state_json: str) -> None:
    """Replace a store's whole state, waking its waiters."""
    parse_json_option("JSON", state_json)
    with backend_of(ctx) as backend:
        click.echo(backend.stores.set(name, state_json).state_json)


@main.command()
@click.argument("app")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Worker processes, one per concurrent delivery (at most 256).")
@click.option("--lease-ms", type=click.IntRange(min=1), default=30_000, show_default=True)
@click.option("--renew-ms", type=click.IntRange(min=1), default=None, help="Default: a third of --lease-ms.")
@click.option("--heartbeat-ms", type=click.IntRange(min=1), default=None,
              help="Default: 1000, or a tenth of --lease-ms when that is shorter.")
@click.option("--heartbeat-misses", type=click.IntRange(min=1), default=3, show_default=True,
              help="Silent heartbeat intervals before a worker gives up on the supervisor, or it on them.")
@click.option("--poll-ms", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--grace-ms", type=click.IntRange(min=0), default=10_000, show_default=True)
@click.option("--durability", type=click.Choice(["normal", "full"]), default="normal", show_default=True)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is running and nothing is due.")
@click.option("--summary", "summary_s", type=click.FloatRange(min=0.1), default=None,
              help="Print a summary line every this many seconds.")
@click.option("--quiet", is_flag=True, help="No line per delivery.")
@click.pass_context
@handles_errors
def supervise(ctx, app, concurrency, lease_ms, renew_ms, heartbeat_ms, heartbeat_misses, poll_ms, grace_ms,
              durability, until_idle, summary_s, quiet) -> None:
    """Run a supervisor for the workflows defined in APP (a module name or a .py path)."""
    from .dispatcher import Supervisor, SupervisorConfig

    config = SupervisorConfig(
        concurrency=concurrency, lease_ms=lease_ms, renew_ms=renew_ms, heartbeat_ms=heartbeat_ms,
        heartbeat_misses=heartbeat_misses,
        poll_ms=poll_ms, grace_ms=grace_ms, durability=durability)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s yieldstar[%(process)d] %(message)s")
    supervisor = Supervisor(ctx.obj["db"], app, config)
    if summary_s:
        _print_summaries(supervisor, summary_s)
    sys.exit(supervisor.run(until_idle=until_idle))


@main.command()
@click.option("--act", "acts", type=click.IntRange(1, 3), multiple=True,
              help="Play only this act (1: slow charge, 2: frozen worker, 3: killed supervisor); repeatable.")
@click.option("--keep", is_flag=True, help="Keep the temporary ledgers and logs, and say where.")
@handles_errors
def demo(acts: tuple[int, ...], keep: bool) -> None:
    """The order shop from RFC 002, with real processes, on a temporary database."""
    from .demo import run_demo

    sys.exit(run_demo(sorted(set(acts)) or None, keep=keep, out=lambda line: click.echo(line)))


@main.command()
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seeds the workload and the fault plan: the same seed replays the same run, timing aside.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=1), default=60, show_default=True,
              help="Seconds of faults; the workload is admitted over the first 85% of them.")
@click.option("--supervisors", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True,
              help="Workers per supervisor.")
@click.option("--executions", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Executions the harness admits (workflows start more).")
@click.option("--lease-ms", type=click.IntRange(min=1), default=1500, show_default=True)
@click.option("--renew-ms", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--heartbeat-ms", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--faults", "fault_kinds", multiple=True, metavar="KINDS",
              help="Fault kinds, repeated or comma-separated (default all): kill_child, freeze_child,"
                   " kill_supervisor, freeze_supervisor, term_supervisor, hold_write_lock, disk_full (root only:"
                   " the ledger goes on a tmpfs), slow_start, clock_skew; none for a control run. The default"
                   " leaves out, with a notice, the kinds this host cannot inject; naming such a kind is an error.")
@click.option("--fault-interval-ms", type=click.IntRange(min=10), default=1200, show_default=True,
              help="Mean gap between two faults.")
@click.option("--lenient-supervisors", type=click.IntRange(min=0), default=None,
              help="How many supervisors run with --heartbeat-misses 100, so that their frozen workers write"
                   " on after a thaw and only the fencing token stops them (default: 1 when there are two or more).")
@click.option("--drain-timeout", "drain_timeout_s", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Seconds to wait, after the faults, for every execution to become terminal.")
@click.option("--db", "chaos_db", default=None,
              help="The ledger, which must hold no executions (default: ledger.db in the work folder)."
                   " The global --db is not used, so chaos never lands in a real ledger by accident.")
@click.option("--workdir", default=None, help="The work folder for logs and evidence (default: a new"
                                               " temporary folder, kept).")
@click.option("--report", "report_path", default=None, help="Write the JSON report to this file.")
@click.option("--summary", "summary_path", default=None, help="Write the one-screen summary to this file too.")
@handles_errors
def chaos(seed, duration_s, supervisors, concurrency, executions, lease_ms, renew_ms, heartbeat_ms, fault_kinds,
          fault_interval_ms, lenient_supervisors, drain_timeout_s, chaos_db, workdir, report_path, summary_path) -> None:
    """Kill, freeze and orphan supervisors and workers mid-step, then prove nothing was lost.

    Exit code 0 only if every execution is terminal and no invariant was violated."""
    from .chaos import ChaosConfig, parse_kinds, run_chaos
    from .chaos.report import save

    config = ChaosConfig(seed=seed, duration_s=duration_s, supervisors=supervisors, concurrency=concurrency,
                         executions=executions, lease_ms=lease_ms, renew_ms=renew_ms, heartbeat_ms=heartbeat_ms,
                         faults=parse_kinds(fault_kinds), fault_interval_s=fault_interval_ms / 1000,
                         lenient_supervisors=lenient_supervisors, drain_timeout_s=drain_timeout_s)
    report = run_chaos(config, folder=workdir, db_path=chaos_db, out=click.echo, tty=sys.stdout.isatty())
    click.echo("\n".join(save(report, json_path=report_path, summary_path=summary_path)))
    sys.exit(0 if report["ok"] else 1)

def _print_summaries(supervisor, every_s: float) -> None:
    def loop() -> None:
        stop = threading.Event()
        while not stop.wait(every_s):
            s = supervisor.stats
            click.echo(f"claimed {s.claimed}  completed {s.completed}  failed {s.failed}  suspended {s.suspended}"
                       f"  released {s.released}  lost {s.lost}  worker deaths {s.child_deaths}", err=True)

    threading.Thread(target=loop, name="summary", daemon=True).start()


if __name__ == "__main__":  # pragma: no cover
    main()
