"""`Queue`: a named set of limits that the claims of its executions obey, across every supervisor
and host sharing the ledger (SPEC section 12). An app declares its queues by naming them in
`@workflow(..., queue=...)`; a supervisor records their limits in the ledger when it starts (the
latest start wins), and every claim checks them in its own transaction
(`supervisor.ledger.tables.queues`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from supervisor.ledger.arguments import identifier
from supervisor.ledger.tables.queues import limits


@dataclass(frozen=True)
class Queue:
    """`Queue("email", concurrency=5, per_key=1, rate=(10, 1.0))`.

    Args:
        name: the queue's name; "default" is every execution's unless its workflow or its start
            names another.
        concurrency: at most this many live leases of the queue's executions at any instant.
        per_key: at most this many live leases per key (executions started without a key are not
            limited by it).
        rate: (count, seconds): at most `count` claims of its executions in any window of
            `seconds`.

    Raises:
        InvalidArgument: a limit that is not an int >= 1, a rate that is not (count >= 1, seconds > 0).
    """

    name: str
    concurrency: Optional[int] = None
    per_key: Optional[int] = None
    rate: Optional[tuple[int, float]] = None

    def __post_init__(self) -> None:
        identifier("queue name", self.name)
        limits(self.concurrency, self.per_key, self.rate)
        if self.rate is not None:
            object.__setattr__(self, "rate", (self.rate[0], float(self.rate[1])))

    @property
    def limited(self) -> bool:
        return (self.concurrency, self.per_key, self.rate) != (None, None, None)
