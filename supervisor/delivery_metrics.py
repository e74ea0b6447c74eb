"""What the dispatcher loop tells the metrics as deliveries go: the no-op default.

The loop calls these on every claim, report and settlement, whether or not `supervise --metrics`
was given: without it they are this class's empty methods (a call each, nothing imported); with
it, `metrics_server.PrometheusMetrics` observes them. Each takes what the loop already holds,
so reporting never costs the loop a database call or a wait.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .pool import Delivery


class DeliveryMetrics:
    """The loop's reports, ignored (see the module docstring). Called on the loop's thread only."""

    def claimed(self, delivery: Delivery, due_at: Optional[int]) -> None:
        """`delivery` was claimed; its execution had been due since `due_at` (ledger ms)."""

    def steps_ran(self, delivery: Delivery, seconds: Sequence[float]) -> None:
        """The worker's report of `delivery` said how long each of its step attempts took."""

    def ended(self, delivery: Delivery, outcome: str, now: float) -> None:
        """`delivery` ended as `outcome` (completed, failed, suspended, released, lost; or
        crashed and killed, its worker died or was killed and its lease left to expire) at
        `now` (monotonic s)."""

    def storage_error(self, call: str) -> None:
        """A ledger call met a storage error; `call` names its ledger method (`Call.name`)."""
