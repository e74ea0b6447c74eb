"""An acknowledgement as the executions client checks and stores it: `Acknowledgement`, and the
statements that end a delivery with its outcome.

A caller hands `(lease, outcome)` pairs (`ExecutionClient.acknowledge_and_claim`); each is
checked once, up front, into an `Acknowledgement`, which every later step reads by name: the
statement that stores it (`leases`), the columns of PostgreSQL's one-call batch
(`supervisor.ledger.postgres.executions`), the lease history's outcome and the executions that
ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .. import arguments
from ..values import Completed, ExecutionLease, Failed, LeaseLost, Outcome, Suspended

# The fence is the WHERE clause: current token, delivery not ended.
ACKNOWLEDGE_SUSPENDED = """
UPDATE executions SET status = 'suspended', ever_suspended = 1, lease_expires_at = NULL,
    unacknowledged_deliveries = 0, delivery_ended_at = NULL, due_at = wake_during_lease,
    ready_at = wake_during_lease, wake_during_lease = NULL, updated_at = $p
WHERE execution_id = $p AND token = $p AND status = 'running'"""

# A diverged replay parks the execution (`parking`): suspended, and not due whatever wake its
# delivery covered; the caller registers why in the same transaction (`parking.PARK`).
ACKNOWLEDGE_PARKED = """
UPDATE executions SET status = 'suspended', ever_suspended = 1, lease_expires_at = NULL,
    unacknowledged_deliveries = 0, delivery_ended_at = NULL, due_at = NULL,
    ready_at = NULL, wake_during_lease = NULL, updated_at = $p
WHERE execution_id = $p AND token = $p AND status = 'running'"""

ACKNOWLEDGE_TERMINAL = """
UPDATE executions SET status = $p, result_json = $p, error_json = $p, lease_expires_at = NULL,
    unacknowledged_deliveries = 0, delivery_ended_at = NULL, due_at = NULL, ready_at = NULL,
    wake_during_lease = NULL, updated_at = $p
WHERE execution_id = $p AND token = $p AND status = 'running'"""


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """One checked acknowledgement: the delivery's lease, its outcome, and what the outcome
    stores (`status`, for a terminal one its `result_json` or `error_json`, and for a suspension
    that parks the execution how its replay `diverged`)."""

    lease: ExecutionLease
    outcome: Outcome
    status: str
    result_json: Optional[str] = None
    error_json: Optional[str] = None
    diverged: Optional[str] = None

    @classmethod
    def of(cls, lease: ExecutionLease, outcome: object, *, max_payload_bytes: Optional[int] = None
           ) -> "Acknowledgement":
        """The acknowledgement of a checked `lease` with `outcome`, checked.

        Raises:
            PayloadTooLarge: its result or error is longer than `max_payload_bytes` (None: no limit).
            InvalidArgument: `outcome` is not an outcome, its JSON is not JSON, or a suspension's
                `diverged` is not a non-empty str of at most `arguments.MAX_DETAIL_LENGTH`
                characters.
        """
        if isinstance(outcome, Suspended):
            if outcome.diverged is None:
                return cls(lease, outcome, outcome.status)
            return cls(lease, outcome, outcome.status,
                       diverged=arguments.detail("outcome.diverged", outcome.diverged))
        if isinstance(outcome, Completed):
            arguments.json_text("outcome.result_json", outcome.result_json, limit=max_payload_bytes)
            return cls(lease, outcome, outcome.status, outcome.result_json, None)
        if isinstance(outcome, Failed):
            arguments.json_text("outcome.error_json", outcome.error_json, limit=max_payload_bytes)
            return cls(lease, outcome, outcome.status, None, outcome.error_json)
        raise arguments.InvalidArgument(
            f"outcome must be Suspended(), Completed(result_json) or Failed(error_json), not {outcome!r}"
        )

    @property
    def delivery(self) -> tuple[str, int]:
        """(execution_id, token): the delivery it ends."""
        return self.lease.execution_id, self.lease.token

    @property
    def terminal(self) -> bool:
        """Whether it ends the execution (completed or failed), not only the delivery."""
        return not isinstance(self.outcome, Suspended)

    def statement(self, now: int) -> tuple[str, tuple]:
        """The fenced statement that stores it at `now` (a template), and its parameters."""
        lease = self.lease
        if isinstance(self.outcome, Suspended):
            return (ACKNOWLEDGE_SUSPENDED if self.diverged is None else ACKNOWLEDGE_PARKED,
                    (now, lease.execution_id, lease.token))
        return ACKNOWLEDGE_TERMINAL, (self.status, self.result_json, self.error_json, now, lease.execution_id,
                                      lease.token)


def ended_executions(acknowledgements: Sequence[Acknowledgement], replies: Sequence[object]) -> list[str]:
    """The executions that `acknowledgements` made terminal (`replies`: theirs, in order)."""
    return [acknowledgement.lease.execution_id for acknowledgement, reply in zip(acknowledgements, replies)
            if acknowledgement.terminal and not isinstance(reply, LeaseLost)]
