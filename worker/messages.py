"""Talking to a running workflow from inside it (SPEC section 14): `ctx.recv` and `ctx.set_event`.

`recv` is a recorded step, keyed as an unnamed step is (`@<n>:recv:<topic>`). It takes the
topic's oldest pending message under that key, fenced by the delivery's token
(`MessageClient.take`): the key is the message's receipt in the ledger, so a delivery that
crashed after taking a message and before recording the step gets the same message when it is
replayed, and no message is taken twice. With nothing to take it registers a waiter (woken by
the send's commit) and suspends. With a `timeout`, a durable timer step comes first
(`@<n>:recv-deadline:<topic>`, recorded as `ctx.sleep` records one): a delivery past it records
the recv's outcome as None, so a replay agrees even if a message arrives later.

`set_event` sets the event through the fenced ledger call, then records an unnamed step, so a
replay does not set it again once recorded (and sets the same value again if it was not). A fork
reads that step's key (`@<n>:set_event:<key>`) to tell which events its copied steps set
(`supervisor.ledger.tables.forks`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, cast

from supervisor.ledger.arguments import MAX_TIME_MS, finite, identifier, to_json
from supervisor.ledger.errors import InvalidArgument

if TYPE_CHECKING:  # the context imports this module
    from .context import WorkflowContext


def _checked_timeout(timeout: Optional[float]) -> Optional[int]:
    """`timeout` seconds as ms, or None."""
    if timeout is None:
        return None
    if not finite(timeout) or timeout < 0:
        raise InvalidArgument(f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}")
    return min(int(timeout * 1000), MAX_TIME_MS)


class MessagesMixin:
    def recv(self, topic: str = "default", timeout: Optional[float] = None) -> Any:
        """The next message sent to this execution on `topic`, taken exactly once; suspends until
        one arrives, or returns None once `timeout` seconds have passed since this recv first ran."""
        ctx = cast("WorkflowContext", self)
        ctx._alive()
        identifier("topic", topic)
        timeout_ms = _checked_timeout(timeout)
        until = None
        if timeout_ms is not None:
            deadline_key = ctx._auto_key_named(f"recv-deadline:{topic}")
        key = ctx._auto_key_named(f"recv:{topic}")
        if key in ctx._recorded:
            return ctx._replay(key, ctx._recorded[key])
        if timeout_ms is not None:
            record = ctx._recorded.get(deadline_key)
            if record is None:
                record = ctx._write(deadline_key, 1, True, {"until": min(ctx._now() + timeout_ms, MAX_TIME_MS)})
            until = json.loads(record.step_response_json)["until"]
        messages = ctx._backend.messages
        while True:
            taken = ctx._writer.fenced_call(f"recv {key!r}", messages.take, topic, step_key=key)
            if taken is not None:
                return ctx._recorded_step(key, lambda: json.loads(taken.message_json))
            if until is not None and ctx._now() >= until:
                return ctx._recorded_step(key, lambda: None)
            if not ctx._writer.call(messages.wait, ctx.execution_id, topic):
                if until is not None:
                    ctx._suspend_until(until)
                ctx._suspend_waiting(f"a message on topic {topic!r}")

    def set_event(self, key: str, value: Any) -> None:
        """Publish `value` (any JSON value) as the event `key`, readable from outside
        (`client.get_event`); the event's value is the last one set."""
        ctx = cast("WorkflowContext", self)
        ctx._alive()
        identifier("event key", key)
        value_json = to_json(f"event {key!r} value", value, limit=ctx._backend.max_payload_bytes)
        step = ctx._auto_key_named(f"set_event:{key}")
        if step in ctx._recorded:
            return
        ctx._writer.fenced_call(f"event {key!r}", ctx._backend.events.set, key, value_json)
        ctx._recorded_step(step, lambda: None)
