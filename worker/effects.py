"""Effects from a workflow: external operations that must not repeat (RFC 004).

Fencing cannot stop a frozen holder from calling the outside world before its write is refused.
An effect can: its id, the same on every replay and every holder, goes to the external system as
the idempotency key, and the ledger keeps the first settled result for everyone.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from supervisor.arguments import to_json
from supervisor.values import SettleConflict

from .retry import RetryPolicy


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
        key = self._named_key(key)
        effect_id = self._derived_id(key)
        effects = self._backend.effects
        if external:
            return self._external_effect(key, effect_id, fn)

        def perform() -> Any:
            state = self._writer.call(effects.begin, effect_id)
            if state.status == "settled":  # another holder, or an outside system, got there first
                return json.loads(state.result_json)
            result_json = to_json(f"the result of effect {key!r}", fn(effect_id))
            reply = self._writer.call(effects.settle, effect_id, result_json)
            kept = reply.kept_result_json if isinstance(reply, SettleConflict) else reply.result_json
            return json.loads(kept)

        return self._step(key, perform, (), {}, retry)

    def _external_effect(self, key: str, effect_id: str, fn: Callable[[str], Any]) -> Any:
        # The request is a step of its own, and its key is taken like any other: a step the
        # workflow itself names `<key>#requested` is refused, instead of standing in for it.
        requested = self._claim_key(f"{key}#requested")
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
        self.steps_run += 1
        return self._replay(key, self._write(key, 1, True, {"value": json.loads(state.result_json)}))
