"""Commands that look at executions: `get`, `ls`, `steps`, `history`, and `wake`.

Text output is for people: local ISO-8601 times with a relative hint, JSON values as JSON,
a failed execution's traceback as lines. `--json` is for programs: the field names of SPEC
section 3 with epoch-ms times, unchanged by anything here.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..humane import format_time, parse_time
from ..ledger.values import TERMINAL_STATUSES, ExecutionRecord, ExecutionStatus, WaitReason
from . import (
    EXIT_UNKNOWN,
    backend_of,
    fail,
    handles_errors,
    main,
    params,
)
from .payloads import cut_short, is_long, json_object, shown

TIME_FIELDS = ("due_at", "lease_expires_at", "created_at", "updated_at", "deadline_at")
LABEL = 27  # wide enough for `unacknowledged_deliveries`
PAYLOADS = {"input_json": "input", "result_json": "result", "error_json": "error"}

full_option = click.option("--full", is_flag=True, help="Print long payloads whole, not cut short.")


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON object (payloads whole).")
@full_option
@click.pass_context
@handles_errors
def get(ctx, execution_id: str, as_json_: bool, full: bool) -> None:
    """Show one execution, what it waits for, and whether a live supervisor serves its workflow."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        record = backend.executions.get(execution_id, now=now)
        if record is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        waiting = backend.executions.waiting_for(execution_id, now=now)
        served = record.workflow in backend.supervisors.served(now=now)
        talk = talked_with(backend, execution_id)
    if as_json_:
        click.echo(json_object(record, waiting_for=[asdict(w) for w in waiting], served=served, **talk))
        return
    lines = record_lines(record, waiting, now, full=full)
    if "pending_messages" in talk:
        counts = ", ".join(f"{count} on {json.dumps(topic)}" for topic, count in talk["pending_messages"].items())
        lines.append(f"{'pending messages':<{LABEL}} {counts}")
    for key, value in talk.get("events", {}).items():
        lines.append(f"{'event ' + json.dumps(key):<{LABEL}} {shown(json.dumps(value), full)}")
    if not served and record.status not in TERMINAL_STATUSES:
        lines.append(f"{'served':<{LABEL}} no: no live supervisor serves workflow {record.workflow!r}; it waits for one")
    click.echo("\n".join(lines))


def talked_with(backend, execution_id: str) -> dict:
    """What `get` adds for an execution that has messages or events (SPEC section 14):
    `pending_messages`, how many wait to be taken by topic, and `events`, each key's latest
    value; each only when it has any, so the record of an execution that has neither reads as
    it always did."""
    talk: dict = {}
    pending = backend.messages.pending(execution_id)
    if pending:
        talk["pending_messages"] = pending
    events = backend.events.list(execution_id)
    if events:
        talk["events"] = {event.key: json.loads(event.value_json) for event in events}
    return talk


def record_lines(record: ExecutionRecord, waiting: list[WaitReason], now: int, *, full: bool = False) -> list[str]:
    """`get`'s text: one labelled line per field, then the error's traceback and the waits; a
    long payload cut short unless `full` (`supervisor.cli.payloads`)."""
    lines = []
    for key, value in asdict(record).items():
        if key == "deadline_at" and value is None:
            continue  # no workflow timeout: nothing to say
        if key in TIME_FIELDS:
            text = format_time(value, now=now)
        elif key == "error_json" and value is not None and (full or not is_long(value, error=True)):
            error = json.loads(value)
            if isinstance(error, dict):
                lines += labelled("error", error_lines(error))
                continue
            text = shown(value, full)
        elif key in PAYLOADS:
            text = shown(value, full)
        elif key == "key" and value is None:
            text = "(none)"  # not limited by its queue's per_key
        else:
            text = str(value)
        lines.append(f"{PAYLOADS.get(key, key):<{LABEL}} {text}")
    if waiting:
        lines += labelled("waiting for", [describe_wait(w, now) for w in waiting])
    return lines


def labelled(label: str, texts: list[str]) -> list[str]:
    """The first text after the label, the rest indented under it."""
    return [f"{label if i == 0 else '':<{LABEL}} {text}" for i, text in enumerate(texts)]


def error_lines(error: dict) -> list[str]:
    """`Type: message`, then the traceback one line a line, then any other keys as JSON."""
    head = str(error.get("type") or "error")
    if error.get("message") is not None:
        head += f": {error['message']}"
    lines = [head]
    traceback = error.get("traceback")
    if isinstance(traceback, str):
        lines += traceback.rstrip("\n").splitlines()
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    if rest:
        lines.append(json.dumps(rest))
    return lines


def describe_wait(reason: WaitReason, now: int) -> str:
    """One `WaitReason` as a phrase: `timer "nap" until 2026-...(in 4 s)`."""
    at = format_time(reason.at, now=now)
    target = json.dumps(reason.target) if reason.target is not None else ""
    if reason.kind == "timer":
        return f"timer {target} until {at}"
    if reason.kind == "retry":
        return f"retry of step {target} at {at}" + (f", after {reason.detail}" if reason.detail else "")
    if reason.kind == "redelivery":
        return f"redelivery backoff until {at}" + (f" ({reason.detail})" if reason.detail else "")
    if reason.kind == "execution":
        return f"execution {target} to finish"
    if reason.kind == "effect":
        return f"effect {target} to be settled"
    if reason.kind == "store":
        return f"a change to store {target}" + (f" matching {reason.detail}" if reason.detail else "")
    if reason.kind == "message":
        return f"a message on topic {json.dumps(reason.detail)}: yieldstar send {target} JSON --topic ..."
    if reason.kind == "wake":
        return f"a wake requested for {at}" if reason.at is not None else "nothing: not due until something wakes it"
    if reason.kind == "code":
        return (f"new code for workflow {target}: parked, its replay diverged"
                + (f" ({reason.detail})" if reason.detail else "")
                + "; a supervisor that serves the workflow tries it when it starts, or `yieldstar resume`")
    if reason.kind == "due":
        return f"a supervisor to claim it, due since {at}"
    return " ".join(str(part) for part in (reason.kind, reason.target, at, reason.detail) if part is not None)


@main.command(name="ls")
@click.option("--workflow", default=None, callback=params.identifier, help="Only executions of this workflow.")
@click.option("--status", type=click.Choice([s.value for s in ExecutionStatus]), help="Only executions in this status.")
@click.option("--since", default=None, metavar="TIME",
              help="Only those created at or after TIME: ISO-8601 (local unless it has an offset), a duration ago"
                   " (30s, 15m, 7d) or epoch ms.")
@click.option("--until", default=None, metavar="TIME", help="Only those created before TIME (as --since).")
@click.option("--id-prefix", default=None, metavar="PREFIX", callback=params.identifier, help="Only those whose id starts with PREFIX.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most this many (0: print nothing).")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="Skip this many matches first.")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def list_executions(ctx, workflow: str | None, status: str | None, since: str | None, until: str | None,
                    id_prefix: str | None, limit: int | None, offset: int, as_json_: bool) -> None:
    """List executions, newest first."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        records = backend.executions.list(
            status=status, workflow=workflow, id_prefix=id_prefix, limit=limit, offset=offset, now=now,
            since=None if since is None else parse_time(since, now=now, option="--since"),
            until=None if until is None else parse_time(until, now=now, option="--until"))
    if as_json_:
        click.echo(json_array(records))
        return
    if limit == 0:
        return  # asked for nothing: not even a header
    rows = [("ID", "WORKFLOW", "STATUS", "TOKEN", "UNACKED", "CREATED", "UPDATED", "QUEUE", "KEY", "PRIORITY")]
    rows += [(r.execution_id, r.workflow, str(r.status), str(r.token), str(r.unacknowledged_deliveries),
              format_time(r.created_at, now=now), format_time(r.updated_at, now=now), r.queue,
              "-" if r.key is None else r.key, str(r.priority)) for r in records]
    click.echo("\n".join(aligned(rows, right=(3, 4, 9))))


def json_array(records: list) -> str:
    """Records as one JSON array of `json_object`s."""
    return "[" + ", ".join(json_object(r) for r in records) + "]"


def aligned(rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows as columns padded to their widest cell, two spaces apart; the columns in `right`
    (numbers) right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            .rstrip() for row in rows]


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array (responses whole).")
@full_option
@click.pass_context
@handles_errors
def steps(ctx, execution_id: str, as_json_: bool, full: bool) -> None:
    """Show the recorded steps of one execution, in the order written."""
    with backend_of(ctx, create=False) as backend:
        if backend.executions.get(execution_id) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        records = backend.heap.steps(execution_id)
    if as_json_:
        click.echo(json_array(records))
        return
    for r in records:
        if not full and is_long(r.step_response_json, error=r.step_response_json.startswith('{"error"')):
            response, traceback = cut_short(r.step_response_json), []
        else:
            response, traceback = without_traceback(r.step_response_json)
        click.echo(f"{r.step_key}\tattempt={r.attempt}\tdone={str(r.done).lower()}\t{response}")
        for line in traceback:
            click.echo(f"    {line}")


def without_traceback(response_json: str | None) -> tuple[str | None, list[str]]:
    """A step's response as `steps` prints it: the JSON, less the traceback of an error, which
    comes back as lines to print under it (as `get` prints an execution's)."""
    response = None if response_json is None else json.loads(response_json)
    error = response.get("error") if isinstance(response, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("traceback"), str):
        return response_json, []
    traceback = error["traceback"]
    shown = {**response, "error": {k: v for k, v in error.items() if k != "traceback"}}
    return json.dumps(shown), traceback.rstrip("\n").splitlines()


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON array.")
@click.pass_context
@handles_errors
def history(ctx, execution_id: str, as_json_: bool) -> None:
    """Show the lease history of one execution: one row per delivery."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        if backend.executions.get(execution_id, now=now) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        records = backend.executions.history(execution_id, now=now)
    if as_json_:
        click.echo(json.dumps([asdict(r) for r in records]))
        return
    for r in records:
        click.echo(f"token={r.token}  holder={r.holder}  claimed_at={format_time(r.claimed_at, now=now)}"
                   f"  expires_at={format_time(r.expires_at, now=now)}  ended_at={format_time(r.ended_at, now=now)}"
                   f"  renewals={r.renewals}"
                   f"  ended={r.ended_by or 'live'}" + (f"  outcome={r.outcome}" if r.outcome else ""))


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--at", default=None, metavar="TIME",
              help="When: ISO-8601 (local unless it has an offset), a duration from now (30s, 15m) or epoch ms"
                   " (default: now).")
@click.pass_context
@handles_errors
def wake(ctx, execution_id: str, at: str | None) -> None:
    """Request a wake of one execution."""
    with backend_of(ctx, create=False) as backend:
        now = backend.clock()
        if backend.executions.get(execution_id, now=now) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        at_ms = now if at is None else parse_time(at, now=now, future=True, option="--at")
        backend.executions.request_wake(execution_id, at_ms, now=now)
