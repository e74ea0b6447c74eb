"""The lease renewer: a thread with its own database connection that keeps live leases alive.

It runs apart from the dispatcher's loop so that a renewal never queues behind a claim, an
acknowledgement or a child start. It renews only deliveries whose child answered a heartbeat
recently: a frozen child's lease is left to run out, which is what lets another holder in.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .values import LeaseLost, Renewed

log = logging.getLogger("yieldstar.supervisor")


class Renewer:
    def __init__(self, backend, *, lease_ms: int, renew_s: float,
                 live_deliveries: Callable[[], list], on_lost: Callable[[object], None]):
        """
        Args:
            backend: a backend of its own (its own connection), used only by this thread.
            live_deliveries: returns the `Delivery` objects whose child is responsive now.
            on_lost: called with a delivery whose renewal came back `LeaseLost`.
        """
        self._backend = backend
        self._lease_ms = lease_ms
        self._renew_s = renew_s
        self._live = live_deliveries
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
        self.renewals = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._backend.close()

    def _run(self) -> None:
        while not self._stop.wait(self._renew_s):
            for delivery in self._live():
                if delivery.lost:
                    continue
                try:
                    reply = self._backend.executions.renew(delivery.lease, duration=self._lease_ms)
                except Exception as exc:  # a busy database: try again next round, the lease has slack
                    log.warning("renewal of %s failed: %s", delivery.lease.execution_id, exc)
                    continue
                if isinstance(reply, Renewed):
                    delivery.lease = reply.lease
                    self.renewals += 1
                elif isinstance(reply, LeaseLost):
                    delivery.lost = True
                    self._on_lost(delivery)
