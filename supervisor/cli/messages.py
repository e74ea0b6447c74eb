"""Commands that talk to a running execution (SPEC section 14): `send` and `events`."""

from __future__ import annotations

import json

import click

from . import (
    EXIT_UNKNOWN,
    backend_of,
    fail,
    handles_errors,
    main,
    max_payload_bytes,
    max_payload_option,
    params,
    parse_json_option,
)


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.argument("message_json", metavar="JSON")
@click.option("--topic", default="default", show_default=True, callback=params.identifier,
              help="The topic its ctx.recv(topic) takes it from.")
@click.option("--id", "message_id", callback=params.identifier,
              help="The message's id; sending again with the same id adds nothing (default: a new id).")
@max_payload_option
@click.pass_context
@handles_errors
def send(ctx, execution_id: str, message_json: str, topic: str, message_id: str | None,
         max_payload: str | None) -> None:
    """Send the message JSON to execution ID, waking its ctx.recv. Prints the message kept, and
    whether this send added it (a repeated --id adds nothing, even once the execution has ended).
    An unknown execution exits 1; a new message to a terminal one, or bad input, exits 2 and
    sends nothing."""
    import uuid

    limit = max_payload_bytes(max_payload)
    parse_json_option("JSON", message_json, limit)
    with backend_of(ctx, create=False, max_payload_bytes=limit) as backend:
        message, added = backend.messages.send(execution_id, message_json, topic=topic,
                                               message_id=message_id or uuid.uuid4().hex)
    click.echo(json.dumps({"execution_id": message.execution_id, "id": message.message_id, "topic": message.topic,
                           "seq": message.seq, "added": added}))


@main.command()
@click.argument("execution_id", metavar="ID", callback=params.identifier)
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON object: each key and its value.")
@click.pass_context
@handles_errors
def events(ctx, execution_id: str, as_json_: bool) -> None:
    """Show the events execution ID has set (ctx.set_event), each with its latest value."""
    with backend_of(ctx, create=False) as backend:
        if backend.executions.get(execution_id) is None:
            fail(f"no execution {execution_id!r}", EXIT_UNKNOWN)
        found = backend.events.list(execution_id)
    if as_json_:
        click.echo(json.dumps({event.key: json.loads(event.value_json) for event in found}))
        return
    for event in found:
        click.echo(f"{event.key}\t{event.value_json}")
