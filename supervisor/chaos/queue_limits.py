"""The queue-limit invariants (SPEC section 12), read from the ledger's lease history.

A claim admits a delivery of a limited queue only while the queue has room: at most
`concurrency` live leases of its executions, at most `per_key` per key, at most `rate_count`
claims in any window of `rate_ms`. The checker replays every claim of a limited queue and counts
what that claim had to count:

    live lease   a delivery d of the same queue (and key), claimed no later than the claim c,
                 that had not ended (acknowledged, released, cancelled, fenced) before c and whose
                 last renewed expiry lies after c's time by c's own clock: a dead holder's lease
                 counts until it expires, exactly as the claim's `lease_expires_at > now` does
    window       the claims of the queue made no later than c whose recorded time lies within
                 `rate_ms` before c's recorded time (the claim counts `queue_claims` rows the same
                 way)

The history keeps a lease's last renewed expiry only: a lease that lapsed, was not claimed over,
and was then renewed by its holder (a frozen one, thawed) counts as live throughout, which a claim
made while it had lapsed did not; such a claim, if it filled the queue, is reported.

A claim of a queue with a concurrency or per_key limit ends the deliveries of the queue whose
leases it counted free (run out by its clock: `tables.leases.END_LAPSED`), so none of them counts
for a later claim, even one whose clock runs behind the first claimer's; the history records them
`expired` at their expiry, which does not say when the claim ended them, so the replay ends them
at that claim itself.

Counts only grow at a claim, so the most live leases a queue ever had is the largest count seen
at one of its claims. A claim whose count (itself included) passes a limit is a violation:
`queue_concurrency`, `queue_per_key` or `queue_rate`.

Times are the ledger's, as recorded. Which claim or end came first is read in true time
(`clocks`: each writer's skew taken away), since each write records a time read once it holds the
lock, so true order is commit order; an expiry is compared in the claimer's own clock, as the
claim compared it. Two allowances keep a correct claim from being reported, each zero where it
cannot arise:

- a claim prunes the window's rows by its own clock: a claimer whose clock ran ahead removes rows
  that a later claimer, whose clock runs behind, would still have counted. Each claim's window is
  checked shortened by how far the fleet's fastest clock ran ahead of its claimer's (0 unskewed).
- `end_slack_ms`: on PostgreSQL a claim reads its time before it waits for its queue's row lock,
  so an acknowledgement committed during that wait may record a time after the claim's. A claim
  whose count passes a limit is counted again without the leases that ended within this much
  after it; the figures take that count too. (On SQLite every write reads its time once it holds
  the database's write lock: no such race, no allowance.)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..ledger.values import DeliveryEnd
from .clocks import Clocks

# How a delivery can end before its lease runs out (superseded and expired deliveries end by expiry).
ENDED_BY_HOLDER_OR_OPERATOR = {DeliveryEnd.ACKNOWLEDGED.value, DeliveryEnd.RELEASED.value,
                               DeliveryEnd.CANCELLED.value, DeliveryEnd.FENCED.value}
POSTGRES_END_SLACK_MS = 1_000  # a claim's wait for its queue's row lock, at most (see the docstring)
INVOLVED_SHOWN = 8  # deliveries named in a violation's detail


@dataclass(frozen=True)
class QueueLimits:
    name: str
    concurrency: Optional[int]
    per_key: Optional[int]
    rate_count: Optional[int]
    rate_ms: Optional[int]

    def as_dict(self) -> dict:
        return {"concurrency": self.concurrency, "per_key": self.per_key,
                "rate": None if self.rate_count is None else [self.rate_count, self.rate_ms / 1000]}


@dataclass(frozen=True)
class Delivery:
    """One delivery of a limited queue's execution, its times in true ms and as recorded."""

    execution_id: str
    token: int
    holder: str
    key: Optional[str]
    claimed_raw: int  # by its claimer's clock
    claimed: int  # true
    expires_raw: int  # its last renewed expiry, by its holder's clock
    ended: Optional[int]  # true; None: it ended by expiry (or is still open)

    @property
    def name(self) -> str:
        return f"{self.execution_id}/{self.token}"


@dataclass
class QueueFigures:
    """What one queue's claims saw: the most live leases (and per key, and claims in a window)."""

    limits: QueueLimits
    executions: int = 0
    deliveries: int = 0
    max_live: int = 0
    max_live_at: Optional[int] = None
    max_live_per_key: int = 0
    max_claims_in_window: int = 0
    keys: set = field(default_factory=set)

    def as_dict(self) -> dict:
        found = {**self.limits.as_dict(), "executions": self.executions, "deliveries": self.deliveries,
                 "keys": len(self.keys), "max_live": self.max_live, "max_live_at": self.max_live_at}
        if self.limits.per_key is not None:
            found["max_live_per_key"] = self.max_live_per_key
        if self.limits.rate_count is not None:
            found["max_claims_in_window"] = self.max_claims_in_window
        return found


def check_queue_limits(limits: dict[str, QueueLimits], executions: dict[str, tuple[str, Optional[str]]],
                       history: dict[str, list], live_expiry: dict[str, tuple[int, Optional[int]]],
                       clocks: Clocks, violate: Callable[[str, Optional[str], str], None], *,
                       end_slack_ms: int = 0) -> dict:
    """Check every limited queue's claims; return {queue: figures}.

    Args:
        limits: the `queues` table, by name.
        executions: {execution id: (queue, key)}.
        history: {execution id: lease history rows (execution_id, token, holder, claimed_at,
            expires_at, ended_at, ended_by, outcome), by token}.
        live_expiry: {execution id: (token, lease_expires_at)}: an open lease's expiry is kept on
            its execution.
        violate: `CheckResult.violate`.
    """
    # The ledger clocks' skews (with --hosts all 0: the server's clock; `skews()` gives the wall clocks').
    skews = [life.skew_ms for life in clocks.lives()] or [0]
    by_queue: dict[str, list[Delivery]] = defaultdict(list)
    figures = {name: QueueFigures(limits[name]) for name in sorted(limits)}
    for eid, (queue, key) in executions.items():
        if queue not in figures:
            continue
        figures[queue].executions += 1
        if key is not None:
            figures[queue].keys.add(key)
        by_queue[queue].extend(_deliveries(eid, key, history.get(eid, []), live_expiry.get(eid), clocks))
    for name, found in figures.items():
        deliveries = sorted(by_queue[name], key=_claim_order)
        found.deliveries = len(deliveries)
        _check_live(found, deliveries, violate, end_slack_ms, max(abs(s) for s in skews))
        if found.limits.rate_count is not None:
            _check_rate(found, deliveries, violate, max(skews))
    return {name: found.as_dict() for name, found in figures.items()}


def _deliveries(eid: str, key: Optional[str], rows: list, live: Optional[tuple], clocks: Clocks) -> list[Delivery]:
    found = []
    for _, token, holder, claimed_at, expires_at, ended_at, ended_by, _ in rows:
        if ended_by is None and live is not None and live[0] == token and live[1] is not None:
            expires_at = live[1]
        ended = clocks.true_ms(holder, ended_at) if ended_by in ENDED_BY_HOLDER_OR_OPERATOR else None
        found.append(Delivery(eid, token, holder, key, claimed_at, clocks.true_ms(holder, claimed_at), expires_at,
                              ended))
    return found


def _claim_order(d: Delivery) -> tuple:
    """The claims in true order. True time tells no order between claims of the same ms, so of
    those, the order that counts the fewest live leases at any of them:

    - one that ended in that ms first: a delivery claimed and acknowledged within one ms (a replay
      with nothing left to run) was claimed before a claim it did not hold back in that ms;
    - then the claim whose claimer's clock ran furthest ahead: it counts free (and ends:
      END_LAPSED) every lease that a claim of the same ms by a clock behind it counts free, and
      more. Taken first, it leaves the others fewer to count, and counts fewer itself than it
      would after them; in the other order a claim can see a lease live that the first had
      already ended."""
    return (d.claimed, d.ended != d.claimed, -d.claimed_raw, d.ended if d.ended is not None else float("inf"),
            d.execution_id, d.token)


def _live_at(d: Delivery, claim: Delivery) -> bool:
    """Whether `claim` had to count `d` (claimed no later) as a live lease."""
    if d.ended is not None and d.ended <= claim.claimed:
        return False
    return d.expires_raw > claim.claimed_raw  # by the claimer's clock, as the claim compares it


def _counted(live: list[Delivery], claim: Delivery, limit: Optional[int], end_slack_ms: int) -> list[Delivery]:
    """The leases `claim` had to count against `limit`, of those `live` at its time: beyond the
    limit, less those that ended within `end_slack_ms` after it (an end the claim may have seen
    committed; see the module docstring)."""
    if limit is None or len(live) <= limit or not end_slack_ms:
        return live
    return [d for d in live if d is claim or d.ended is None or d.ended > claim.claimed + end_slack_ms]


def _check_live(found: QueueFigures, deliveries: list[Delivery], violate, end_slack_ms: int,
                max_skew_ms: int) -> None:
    """Replay the claims in order, keeping the leases that may still be live (`active`). A queue
    limited by its rate alone is replayed too: its most live leases are a figure of the run."""
    limits = found.limits
    active: list[Delivery] = []
    for claim in deliveries:
        # Gone for every later claim: ended before this one, or expired by any clock.
        active = [d for d in active if not (d.ended is not None and d.ended <= claim.claimed)
                  and d.expires_raw + 2 * max_skew_ms >= claim.claimed]
        active.append(claim)
        at_claim = [d for d in active if d is claim or _live_at(d, claim)]
        if limits.concurrency is not None or limits.per_key is not None:
            # The claim ended the leases of its queue it counted free (`tables.leases.END_LAPSED`):
            # no later claim counts them, whatever its clock says.
            active = at_claim
        live = _counted(at_claim, claim, limits.concurrency, end_slack_ms)
        if len(live) > found.max_live:
            found.max_live, found.max_live_at = len(live), claim.claimed_raw
        if limits.concurrency is not None and len(live) > limits.concurrency:
            violate("queue_concurrency", claim.execution_id,
                    _detail(limits.name, claim, len(live), f"concurrency {limits.concurrency}", live))
        if claim.key is None:
            continue
        same_key = _counted([d for d in at_claim if d.key == claim.key], claim, limits.per_key, end_slack_ms)
        found.max_live_per_key = max(found.max_live_per_key, len(same_key))
        if limits.per_key is not None and len(same_key) > limits.per_key:
            violate("queue_per_key", claim.execution_id,
                    _detail(limits.name, claim, len(same_key), f"per_key {limits.per_key} (key {claim.key})",
                            same_key))


def _check_rate(found: QueueFigures, deliveries: list[Delivery], violate, fastest_skew_ms: int) -> None:
    """Each claim with the claims before it whose recorded time is within the window of its own,
    shortened by how far the fastest clock ran ahead of its claimer's (see the module docstring)."""
    limits = found.limits
    claimed = [d.claimed for d in deliveries]
    for i, claim in enumerate(deliveries):
        slack = max(0, fastest_skew_ms - (claim.claimed_raw - claim.claimed))
        first = bisect.bisect_left(claimed, claim.claimed - limits.rate_ms - 2 * abs(fastest_skew_ms) - slack - 1)
        window = [d for d in deliveries[first:i + 1]
                  if d is claim or d.claimed_raw > claim.claimed_raw - limits.rate_ms + slack]
        # Claims in the same true ms after this one in order are counted at their own turn.
        found.max_claims_in_window = max(found.max_claims_in_window, len(window))
        if len(window) > limits.rate_count:
            violate("queue_rate", claim.execution_id,
                    _detail(limits.name, claim, len(window),
                            f"rate {limits.rate_count} per {limits.rate_ms} ms", window, what="claims in the window"))


def _detail(queue: str, claim: Delivery, count: int, limit: str, involved: list[Delivery],
            what: str = "live leases") -> str:
    shown = ", ".join(f"{d.name} ({d.holder}, claimed {d.claimed_raw}, expires {d.expires_raw}"
                      + (f", ended {d.ended}" if d.ended is not None else "") + ")"
                      for d in involved[:INVOLVED_SHOWN])
    more = f" and {len(involved) - INVOLVED_SHOWN} more" if len(involved) > INVOLVED_SHOWN else ""
    return (f"queue {queue}: {count} {what} at {claim.claimed_raw} (ledger ms, the claim of {claim.name} by"
            f" {claim.holder}), beyond its {limit}: {shown}{more}")
