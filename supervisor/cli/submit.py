"""Commands that put work in: `start`, `settle`, and the `store` group."""

from __future__ import annotations

import json

import click

from worker.client import Client

from ..humane import parse_duration
from ..ledger.arguments import MAX_TIMEOUT_MS
from ..ledger.errors import StorageError, UnknownEffect
from ..ledger.values import SettleConflict
from . import (
    EXIT_UNKNOWN,
    as_json,
    backend_of,
    fail,
    handles_errors,
    ledger_of,
    main,
    max_payload_bytes,
    max_payload_option,
    params,
    parse_json_option,
    read_json_option,
)
from .payloads import cut_short, is_long


@main.command()
@click.argument("workflow", callback=params.identifier)
@click.option("--id", "execution_id", callback=params.identifier, help="The execution id; repeating a start with the same id starts nothing.")
@click.option("--input", "input_json", default="null", show_default=True,
              help="The workflow's input: JSON, @FILE to read it from a file, or - to read it from stdin.")
@click.option("--queue", callback=params.identifier, help="The queue whose limits its claims obey (default: the workflow's).")
@click.option("--key", callback=params.identifier, help="The key the queue's per_key limit counts it by.")
@click.option("--priority", type=params.priority, help="Higher first (default: the workflow's, else 0).")
@click.option("--timeout", metavar="DURATION",
              help="Fail it as WorkflowTimedOut if not finished this long after now (30s, 5m, 2h; default: the"
                   " workflow's, else none).")
@max_payload_option
@click.pass_context
@handles_errors
def start(ctx, workflow: str, execution_id: str | None, input_json: str, queue: str | None, key: str | None,
          priority: int | None, timeout: str | None, max_payload: str | None) -> None:
    """Admit an execution of WORKFLOW and print its id."""
    limit = max_payload_bytes(max_payload)
    input_json = read_json_option("--input", input_json, limit)
    timeout_s = None if timeout is None else timeout_seconds(timeout)
    with Client(ledger_of(ctx), max_payload_bytes=limit) as client:
        handle = client.start_json(workflow, input_json, id=execution_id, queue=queue, key=key, priority=priority,
                                   timeout=timeout_s)
    click.echo(handle.execution_id)
    note_unserved(ctx, workflow)


def timeout_seconds(text: str) -> float:
    """`--timeout`'s duration in seconds; a duration that is none, or not longer than 0, is
    refused on stderr naming the option, before anything is written."""
    try:
        ms = parse_duration(text)
    except ValueError as exc:
        fail(f"--timeout: {exc}")
    if ms <= 0:
        fail(f"--timeout must be longer than 0, got {text!r}")
    if ms > MAX_TIMEOUT_MS:
        fail(f"--timeout must be at most {MAX_TIMEOUT_MS // 86_400_000:,}d, got {text!r}")
    return ms / 1000


def note_unserved(ctx, workflow: str) -> None:
    """A note on stderr when no live supervisor serves `workflow` (routing, SPEC section 11):
    the execution was admitted all the same, and waits for one. A ledger that cannot say (busy,
    unavailable) gets no note: the start is done."""
    try:
        with backend_of(ctx, create=False) as backend:
            served = backend.supervisors.served()
    except StorageError:
        return
    if workflow not in served:
        click.echo(f"yieldstar: note: no live supervisor serves workflow {workflow!r}; the execution waits, admitted,"
                   " until one that does is running (yieldstar supervisors lists them)", err=True)


@main.command()
@click.argument("effect_id", callback=params.identifier)
@click.option("--result", "result_json", required=True,
              help="The effect's result: JSON, @FILE to read it from a file, or - to read it from stdin.")
@click.option("--create", is_flag=True,
              help="Settle it even if no execution has begun this effect yet (it finds the result when it does).")
@max_payload_option
@click.pass_context
@handles_errors
def settle(ctx, effect_id: str, result_json: str, create: bool, max_payload: str | None) -> None:
    """Settle an effect from outside (an external system finishing its work).

    The first result is kept: settling again with a different one is reported as a conflict
    (exit 2) and changes nothing. An effect id that no execution has begun is refused (exit 2,
    nothing written), as it is most often a typo, unless `--create` is given."""
    limit = max_payload_bytes(max_payload)
    result_json = read_json_option("--result", result_json, limit)
    with Client(ledger_of(ctx), create=create, max_payload_bytes=limit) as client:
        try:
            reply = client.settle_json(effect_id, result_json, create=create)
        except UnknownEffect:
            fail(f"no execution has begun effect {effect_id!r}: check the id, or pass --create to settle it"
                 " before it begins")
    if isinstance(reply, SettleConflict):
        fail(f"effect {effect_id!r} is already settled with {reply.kept_result_json}; {result_json} was not applied")
    click.echo(json.dumps(as_json(reply)))


@main.group()
def store() -> None:
    """Read named stores, and put items into them from outside."""


@store.command(name="ls")
@click.option("--full", is_flag=True, help="Print long states whole, not cut short.")
@click.pass_context
@handles_errors
def store_list(ctx, full: bool) -> None:
    """List every store with its version and its state (a long one cut short)."""
    with backend_of(ctx, create=False) as backend:
        for state in backend.stores.list():
            text = state.state_json if full or not is_long(state.state_json) else cut_short(state.state_json)
            click.echo(f"{state.name}\tversion={state.version}\t{text}")


@store.command(name="get")
@click.argument("name", callback=params.identifier)
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
@click.argument("name", callback=params.identifier)
@click.argument("item_json", metavar="ITEM")
@max_payload_option
@click.pass_context
@handles_errors
def store_put(ctx, name: str, item_json: str, max_payload: str | None) -> None:
    """Append ITEM (JSON) to a list store (a mailbox), waking its waiters."""
    limit = max_payload_bytes(max_payload)
    parse_json_option("ITEM", item_json, limit)
    with backend_of(ctx, max_payload_bytes=limit) as backend:
        click.echo(backend.stores.put(name, item_json).state_json)


@store.command(name="set")
@click.argument("name", callback=params.identifier)
@click.argument("state_json", metavar="STATE")
@max_payload_option
@click.pass_context
@handles_errors
def store_set(ctx, name: str, state_json: str, max_payload: str | None) -> None:
    """Replace a store's whole state with STATE (JSON), waking its waiters."""
    limit = max_payload_bytes(max_payload)
    parse_json_option("STATE", state_json, limit)
    with backend_of(ctx, max_payload_bytes=limit) as backend:
        click.echo(backend.stores.set(name, state_json).state_json)


