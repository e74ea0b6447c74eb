"""Effects from a workflow: external operations that must not repeat (RFC 004).

Fencing cannot stop a frozen holder from calling the outside world before its write is refused.
An effect can: its id, the same on every replay and every holder, goes to the external system as
the idempotency key, and the ledger keeps the first settled result for everyone.
"""

from __future__ import annotations

import json
from typing import Any, Callable, NamedTuple, Optional

from supervisor.ledger.arguments import to_json
from supervisor.ledger.values import SettleConflict

from .retry import RetryPolicy


class Settled(NamedTuple):
    value: Any


class EffectsMixin:
    def effect(self, key: str, fn: Callable[[str], Any], *, retry: Optional[RetryPolicy] = None,
               external: bool = False) -> Any:
        """Perform an external operation once: `fn(effect_id)` must pass `effect_id` to the
        external system as its idempotency key.

        By default `fn` returns the operation's result, which settles the effect. With
        `external=True`, `fn` only requests the work, and the workflow suspends until someone
        settles the effect from outside (`backend.effects.settle` or `yieldstar settle`).
        Returns the settled result (the first one kept, whoever settled it).
        """
        key = self._named_key(key, reach=not external)  # an external one is reached with its request
        effect_id = self._derived_id(key)
        if external:
            return self._external_effect(key, effect_id, fn)

        def perform() -> Any:
            settled = self._effect_begin(effect_id)
            return settled.value if settled is not None else self._effect_settle(key, effect_id, fn(effect_id))

        return self._step(key, perform, (), {}, retry)

    def _effect_begin(self, effect_id: str) -> Optional["Settled"]:
        """Begin the effect; its result if it is settled already (by another holder, or an
        outside system), else None: the caller performs it and settles it."""
        state = self._writer.call(self._backend.effects.begin, effect_id)
        return Settled(json.loads(state.result_json)) if state.status == "settled" else None

    def _effect_settle(self, key: str, effect_id: str, result: Any) -> Any:
        """Settle the effect with `result`; returns the result kept (the first one settled)."""
        result_json = to_json(f"the result of effect {key!r}", result, limit=self._backend.max_payload_bytes)
        reply = self._writer.call(self._backend.effects.settle, effect_id, result_json)
        return json.loads(reply.kept_result_json if isinstance(reply, SettleConflict) else reply.result_json)

    def _external_effect(self, key: str, effect_id: str, fn: Callable[[str], Any]) -> Any:
        # The request is a step of its own, and its key is taken like any other: a step the
        # workflow itself names `<key>#requested` is refused, instead of standing in for it.
        requested = self._claim_key(f"{key}#requested", reach=False)
        self._reach_together([key, requested], None)
        record = self._recorded.get(key)
        if record is not None:
            return self._replay(key, record)
        effects = self._backend.effects
        state = self._writer.call(effects.begin, effect_id)
        if state.status != "settled":
            # Ask for the work once per execution: the request itself is a recorded step.
            def request() -> bool:
                fn(effect_id)
                return True
            self._recorded_step(requested, request)
            state = self._writer.call(effects.wait, effect_id, self.execution_id)
            if state.status != "settled":
                self._suspend_waiting(f"effect {effect_id!r} to settle")
        return self._replay(key, self._write(key, 1, True, {"value": json.loads(state.result_json)}))
