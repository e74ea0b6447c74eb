"""Named durable JSON stores from a workflow (RFC 005).

Every change commits atomically with a receipt keyed by (store, execution, step key) and is
then recorded as a fenced step, so a replay or a stale holder gets the recorded result and the
change applies once. Change functions run inside the ledger's write transaction: keep them
pure and quick.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Iterable

from supervisor.ledger.arguments import to_json
from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.contract import NoMatch

if TYPE_CHECKING:  # the context imports this module
    from .context import WorkflowContext


def _matches(item: Any, match: Any) -> bool:
    if isinstance(match, dict) and isinstance(item, dict):
        return all(k in item and item[k] == v for k, v in match.items())
    return item == match


class StoreHandle:
    """A named store, as `ctx.store(name)` returns it: each change is made once, and recorded."""

    def __init__(self, ctx: WorkflowContext, name: str):
        self._ctx = ctx
        self.name = name

    def get_or_create(self, key: str, initial: Any) -> Any:
        """The store's state, creating it with `initial` if nobody has; the snapshot this
        execution observed is recorded, so replays see the same."""
        ctx = self._ctx
        key = ctx._named_key(key)
        initial_json = to_json(f"the initial value of store {self.name!r}", initial,
                               limit=ctx._backend.max_payload_bytes)
        return ctx._recorded_step(key, lambda: json.loads(
            ctx._writer.call(ctx._backend.stores.get_or_create, self.name, initial_json).state_json))

    def update(self, key: str, fn: Callable[[Any], Any]) -> Any:
        """Replace the state with `fn(state)`, once; returns the new state."""
        def change(state: Any) -> tuple[Any, Any]:
            new = fn(state)
            return new, new
        return self._change(self._ctx._named_key(key), change)

    def update_from(self, key: str, items: dict) -> Any:
        """Merge `items` into an object store, once; returns the new state."""
        if not isinstance(items, dict):
            raise InvalidArgument(f"update_from needs a dict of items, not {type(items).__name__}")

        def change(state: Any) -> tuple[Any, Any]:
            new = {**self._object(state), **items}
            return new, new
        return self._change(self._ctx._named_key(key), change)

    def delete_from(self, key: str, names: Iterable[str]) -> dict:
        """Delete `names` from an object store, once; returns the removed items."""
        names = list(names)

        def change(state: Any) -> tuple[Any, Any]:
            state = dict(self._object(state))
            removed = {n: state.pop(n) for n in names if n in state}
            return state, removed
        return self._change(self._ctx._named_key(key), change)

    def take(self, key: str, match: Any = None, *, wait: bool = True) -> Any:
        """Remove and return the first item of a list store that matches `match` (a dict matches
        items holding those keys and values; anything else matches equal items; None matches
        any item), once. With nothing to take: suspend until the store changes, or return None
        when `wait` is false."""
        ctx = self._ctx
        key = ctx._named_key(key)
        if key in ctx._recorded:
            return ctx._replay(key, ctx._recorded[key])
        stores = ctx._backend.stores

        def change(state: Any) -> tuple[Any, Any]:
            if not isinstance(state, list):
                raise InvalidArgument(f"store {self.name!r} holds a {type(state).__name__}; take needs a list")
            for i, item in enumerate(state):
                if match is None or _matches(item, match):
                    return state[:i] + state[i + 1:], item
            raise NoMatch()

        while True:
            seen = ctx._writer.call(stores.get, self.name)
            # A store nobody created yet holds nothing to take: wait for it like an empty one.
            receipt = None if seen is None else ctx._writer.call(
                stores.change, self.name, execution_id=ctx.execution_id, step_key=key, change=change)
            if receipt is not None:
                return ctx._recorded_step(key, lambda: json.loads(receipt.result_json))
            if not wait:
                return ctx._recorded_step(key, lambda: None)
            match_json = None if match is None else to_json("match", match)
            if not ctx._writer.call(stores.wait, self.name, ctx.execution_id, seen.version if seen else 0,
                                    match_json=match_json):
                ctx._suspend_waiting(f"a change to store {self.name!r}")

    def _object(self, state: Any) -> dict:
        if not isinstance(state, dict):
            raise InvalidArgument(f"store {self.name!r} holds a {type(state).__name__}, not an object")
        return state

    def _change(self, key: str, change: Callable[[Any], tuple]) -> Any:
        ctx = self._ctx
        if key in ctx._recorded:
            return ctx._replay(key, ctx._recorded[key])
        receipt = ctx._writer.call(ctx._backend.stores.change, self.name, execution_id=ctx.execution_id,
                                   step_key=key, change=change)
        return ctx._recorded_step(key, lambda: json.loads(receipt.result_json))


class StoresMixin:
    def store(self, name: str) -> StoreHandle:
        """The named durable JSON store `name`, shared by every execution."""
        self._alive()  # type: ignore[attr-defined]  # of the WorkflowContext this mixes into
        return StoreHandle(self, name)  # type: ignore[arg-type]  # self: the WorkflowContext this mixes into
