"""Keeping the leases of running deliveries: a part of the dispatcher loop (`loop.DispatchLoop`
mixes it in, and owns its state).

Each renewal round renews every live lease in one call (`Renew`); once a heartbeat the loop asks
the ledger which running deliveries have ended there (`Ended`: an operator cancelled one, or it
was claimed again after its lease expired). What they find comes back here (`lose`), as does a
lease that no renewal has confirmed for a lease length (`stop_unconfirmed`):

    renewal finds LeaseLost / Ended finds it ended -> lose
      one delivery per worker   -> the worker killed and replaced (it may be inside a step)
      several per worker        -> Stop(execution, token) to that worker alone -> its Done
    unconfirmed for a lease length -> the same, and the lease released once it has stopped
"""

from __future__ import annotations

import logging
from typing import Optional

from worker._runtime.protocol import Stop

from .ledger.values import Retry
from .ledger_calls import Ended, Renew
from .pool import Child, Delivery

log = logging.getLogger("yieldstar.supervisor")

# What the log says when a delivery is lost (the chaos checker counts these lines: `chaos.evidence`).
LOST_LINE = "execution %s token %d: %s; killing worker pid %d so that it stops at once"
RENEWAL_FOUND_LOST = "the lease is lost"
# The same, found by the heartbeat's check of ended deliveries before a renewal found it.
ENDED_IN_LEDGER = "its delivery ended in the ledger (cancelled, or claimed again after its lease expired)"
# The same, in a worker of several deliveries: that one is told to stop, the others run on.
STOP_LINE = "execution %s token %d: %s; telling worker pid %d to stop it"


class LeaseKeeping:
    """The dispatcher loop's steps that renew leases and stop the deliveries whose lease is lost,
    ended or unconfirmed (see the module docstring); the state they use is `DispatchLoop`'s."""

    def renew(self, now: float) -> None:
        """Renew every lease of a delivery whose child answered recently, and of every delivery
        whose acknowledgement is still on its way (a busy database must not lose it)."""
        if now < self.next_renewal:
            return
        self.next_renewal = now + self.cfg.renew_ms / 1000
        self.refresh_registration()  # this supervisor is live: one small statement a round
        due = [d for d in self.renewable(now) if not d.renewing and not d.lost]
        for delivery in due:
            delivery.renewing, delivery.renew_sent_at = True, now
        if due:  # one call for the round: a few transactions for thousands of leases
            self.renewals.submit(Renew([d.lease for d in due], self.cfg.lease_ms, about=due))

    def renewable(self, now: float) -> list[Delivery]:
        limit = self.cfg.silent_limit_s
        running = [d for c in self.pool.children if now - c.last_answer <= limit for d in c.deliveries.values()]
        return running + list(self.ending.values())

    def stop_unconfirmed(self, now: float) -> None:
        """Stop every delivery whose lease no renewal has confirmed for a whole lease length, and
        give the lease back. The ledger may have let it expire (a database that cannot be
        reached, or answers too slowly; this supervisor paused), and another supervisor claim it:
        this host's child must not go on calling the outside world beside the new holder. A
        worker of one delivery is killed; a worker of several is told to stop that one
        (`stop`), and the lease is given back once it has (`done`). The release is fenced like
        any: refused once another holder has the execution, and otherwise it ends the delivery
        at once instead of leaving it to expire (a renewal still on its way may have extended it
        meanwhile). Costs time, never correctness: the execution is delivered again. (The child
        itself keeps no such timer: what stops a stale write is the fencing token, checked by
        the ledger as the write lands, never a clock.)

        Only once the earliest `held_until` has passed (`next_unconfirmed`, a lower bound): a
        turn of the loop does not look at every delivery."""
        if now < self.next_unconfirmed:
            return
        earliest = float("inf")
        why = f"no renewal has confirmed its lease for {self.cfg.lease_ms} ms"
        for child in list(self.pool.children):
            held = [d for d in child.deliveries.values() if not d.lost]
            due = [d for d in held if now >= d.held_until]
            earliest = min([earliest] + [d.held_until for d in held if now < d.held_until])
            if not due:
                continue
            if not child.process.is_alive() or child.conn.poll(0):
                # It exited meanwhile (its supervisor unheard?), or it has reported: let its
                # sentinel, or its report, be read first, and say what happened; then look again.
                earliest = now
                continue
            self.stats.unconfirmed += len(due)
            if self.shared:
                for delivery in due:
                    self.stop(child, delivery, f"{why} (the database out of reach or too slow, or this supervisor"
                              " paused; another supervisor may hold it)", now, release=True)
                continue
            (delivery,) = due
            log.warning("execution %s token %d: %s (the database out of reach or too slow, or this supervisor paused);"
                        " another supervisor may hold it; killing worker pid %d and giving the lease back",
                        delivery.lease.execution_id, delivery.lease.token, why, child.pid,
                        extra={"event": "lease_unconfirmed", "worker_pid": child.pid, **delivery.log_fields})
            child.delivery = None
            self.replace(child)  # killed and joined: it can do nothing more
            self.end(delivery, Retry(why), now)
        self.next_unconfirmed = earliest

    def stop(self, child: Child, delivery: Delivery, why: str, now: float, *, release: bool = False) -> None:
        """Tell `child`, a worker of several deliveries, to stop `delivery` and leave its others
        running; `release`: give the lease back once it has stopped. No longer renewed from now
        on; its worker is replaced if it has not reported within the heartbeat tolerance."""
        delivery.lost = True
        delivery.stop_sent_at, delivery.stop_why, delivery.release_on_stop = now, why, release
        log.warning(STOP_LINE, delivery.lease.execution_id, delivery.lease.token, why, child.pid,
                    extra={"event": "delivery_stopping", "reason": why, "worker_pid": child.pid, **delivery.log_fields})
        child.send(Stop(delivery.lease.execution_id, delivery.lease.token))  # a dead one shows on its sentinel

    def lose(self, delivery: Delivery, why: str, now: float) -> None:
        """The delivery ended in the ledger (lost, or cancelled): kill its child, which may be
        inside a step calling the outside world, so that it stops at once."""
        child = self.child_of(delivery)
        if child is None or delivery.lost:
            return  # it raced the acknowledgement of this delivery: the acknowledgement decides
        if self.shared:
            # Its report, if already sent, is read as usual; a `Stop` for a delivery that has
            # ended is ignored by the worker.
            self.stop(child, delivery, why, now)
            return
        # What it said already still counts, as when a worker dies (`child_died`): a report of
        # this delivery waiting in its pipe settles it, and the worker, idle again, is kept.
        while child.delivery is delivery and child.conn.poll(0):
            self.receive(child, now)
        if child.delivery is not delivery:
            return
        delivery.lost = True
        self.stats.lost += 1
        self.metrics.ended(delivery, "lost", now)
        log.warning(LOST_LINE, delivery.lease.execution_id, delivery.lease.token, why, child.pid,
                    extra={"event": "lease_lost", "reason": why, "worker_pid": child.pid, **delivery.log_fields})
        child.delivery = None
        self.replace(child)

    def check_ended(self, now: float) -> None:
        """Once a heartbeat, ask the ledger whether any running delivery has ended there (an
        operator cancelled its execution): renewals alone would find out only at the next one."""
        if self.checking_ended or now < self.next_ended_check:
            return
        running = [d for c in self.pool.children for d in c.deliveries.values() if not d.lost]
        if running:
            self.checking_ended = True
            self.renewals.submit(Ended([d.lease for d in running], about=running))

    def child_of(self, delivery: Delivery) -> Optional[Child]:
        return next((c for c in self.pool.children if c.deliveries.get(delivery.key) is delivery), None)
