"""Watching the worker processes: a part of the dispatcher loop (`loop.DispatchLoop` mixes it
in, and owns its state).

The heartbeat beats every ready worker and judges its silence; the loop's `wait` hands each
message a worker sends to `receive`, and each death to `child_died`:

    Ready / AppNotLoaded / LedgerNotOpened -> started (its first message); Ready's workflows
      -> what the loop serves (`serving`)
    Alive -> heard from     Done(execution, token) -> done -> the loop's `end`
    silent past the tolerance, dead, not stopping a delivery it was told to stop, or asking
      to be (a `Done` whose `replace` says why: a step thread it could not stop)
      -> replaced (killed, confirmed gone); one of several deliveries has them released at
         once (`replace_and_release`), one of a single delivery leaves its lease to expire
"""

from __future__ import annotations

import logging
import time

from worker._runtime.protocol import AppNotLoaded, Alive, Beat, Done, FromChild, LedgerNotOpened, Ready

from .ledger.errors import AppLoadFailed, DiedWhileStarting, LedgerUnusable
from .ledger.values import LeaseLost, Retry
from .pool import START_ATTEMPTS, TOP_UP_BUDGET_S, Child, describe_exit

log = logging.getLogger("yieldstar.supervisor")

# After a child could not be started (fork failed): when to try again.
TOP_UP_RETRY_S = 1.0
# While the template forks workers asked for: how often the loop looks for its answer.
FORK_POLL_S = 0.01
# How often exited orphans adopted from dead workers are waited for (`Pool.reap_orphans`).
ORPHAN_CHECK_S = 5.0
RELEASE_LINE = "execution %s token %d: %s; releasing it"  # its worker replaced (`replace_and_release`)


class WorkerWatch:
    """The dispatcher loop's steps that beat, hear and replace its worker processes (see the
    module docstring); the state they use is `DispatchLoop`'s."""

    def beat(self, now: float) -> None:
        if now < self.next_beat:
            return
        self.next_beat = now + self.cfg.heartbeat_ms / 1000
        limit = self.cfg.silent_limit_s
        if self.last_beat_at is not None and now - self.last_beat_at > limit:
            # This process itself was paused (SIGSTOP, an overloaded host): the children's
            # silence is ours. Judge them from now on; renewals and the fence sort out leases.
            log.warning("the supervisor was paused for %.1f s", now - self.last_beat_at,
                        extra={"event": "supervisor_paused", "paused_ms": int((now - self.last_beat_at) * 1000)})
            for child in self.pool.children:
                child.last_answer = now
                for delivery in child.deliveries.values():  # told to stop before the pause: from now on too
                    if delivery.stop_sent_at is not None:
                        delivery.stop_sent_at = now
            # Its workers may have given up on it during the pause and be reporting so now: let
            # them, and let the next renewal round decide about their leases, as before the pause.
            self.next_ended_check = now + self.cfg.renew_ms / 1000
        self.last_beat_at = now
        self.check_ended(now)
        for child in list(self.pool.children):
            if not child.ready:
                if now > child.start_deadline:
                    log.error("worker pid %d did not load the app within %.0f s; replacing it",
                              child.pid, self.pool.start_timeout_s,
                              extra={"event": "worker_start_timeout", "worker_pid": child.pid})
                    self.replace(child)
                continue
            delivery = child.delivery
            expires = min((d.lease.expires_at for d in child.deliveries.values()), default=None)
            if not child.send(Beat(expires)):
                continue  # its death shows on its sentinel
            if now - child.last_answer > limit:
                # Frozen, or stuck in C code holding the GIL: no longer renewed (see renewable).
                # Kill it and leave its lease to expire. An idle one too: it would be handed a
                # lease it cannot run, and its pipe, unread, would fill up with beats until a send
                # blocked this loop.
                if self.shared and child.deliveries:
                    self.stats.children_killed += 1
                    self.replace_and_release(child, f"worker pid {child.pid} silent for"
                                             f" {now - child.last_answer:.1f} s, killed and replaced", now)
                    continue
                if delivery is not None:
                    log.warning("execution %s token %d: worker pid %d silent for %.1f s; killing and replacing it",
                                delivery.lease.execution_id, delivery.lease.token, child.pid,
                                now - child.last_answer,
                                extra={"event": "worker_silent", "worker_pid": child.pid, **delivery.log_fields})
                    self.metrics.ended(delivery, "killed", now)
                else:
                    log.warning("idle worker pid %d silent for %.1f s; killing and replacing it",
                                child.pid, now - child.last_answer,
                                extra={"event": "worker_silent", "worker_pid": child.pid})
                self.stats.children_killed += 1
                child.delivery = None
                self.replace(child)
                continue
            if self.shared:
                self.replace_unstoppable(child, now, limit)

    def replace_unstoppable(self, child: Child, now: float, limit: float) -> None:
        """A worker of several deliveries, one of which was told to stop longer than the heartbeat
        tolerance ago and has not reported (a sync step that sleeps, or code that ignores the
        cancellation): it is replaced, and its other deliveries are given back at once."""
        stuck = next((d for d in child.deliveries.values()
                      if d.stop_sent_at is not None and now - d.stop_sent_at > limit), None)
        if stuck is None:
            return
        log.warning("execution %s token %d: not stopped %.1f s after worker pid %d was told to stop it; killing"
                    " and replacing the worker, and releasing its %d other deliveries", stuck.lease.execution_id,
                    stuck.lease.token, now - stuck.stop_sent_at, child.pid, len(child.deliveries) - 1,
                    extra={"event": "worker_not_stopping", "worker_pid": child.pid, **stuck.log_fields})
        self.stats.children_killed += 1
        self.replace_and_release(child, f"worker pid {child.pid} replaced: a delivery of it did not stop", now)

    def receive(self, child: Child, now: float) -> None:
        """Handle one message from a child."""
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            self.child_died(child)  # its end of the pipe closed: it exited or was killed
            return
        child.last_answer = now
        match message:
            case Alive():
                pass
            case _ if not child.ready:
                self.started(child, message)
            case Done():
                self.done(child, message, now)
                if message.replace is not None:  # after its delivery is handled (a dead one is replaced anyway)
                    self.replace_asked(child, message.replace, now)
            case _:
                log.error("unexpected message from worker pid %d: %r", child.pid, message,
                          extra={"event": "unexpected_message", "worker_pid": child.pid})

    def done(self, child: Child, report: Done, now: float) -> None:
        """A child's report that it finished its delivery."""
        self.claim_wanted = True
        delivery = child.deliveries.pop((report.execution_id, report.token), None)
        if delivery is None:
            log.error("worker pid %d reported %s token %s, which it was not running", child.pid, report.execution_id,
                      report.token, extra={"event": "unexpected_report", "worker_pid": child.pid,
                                           "execution_id": report.execution_id, "token": report.token})
            return
        delivery.ms = report.ms
        self.metrics.steps_ran(delivery, report.steps)
        outcome = report.outcome
        if delivery.release_on_stop and isinstance(outcome, LeaseLost):
            outcome = Retry(delivery.stop_why)  # stopped unconfirmed: give the lease back
        self.end(delivery, outcome, now)

    def replace_asked(self, child: Child, why: str, now: float) -> None:
        """A worker that reported a step thread it could not stop (a sync step past its timeout):
        it is replaced, and its other deliveries are given back at once."""
        log.warning("worker pid %d asked to be replaced: %s; killing and replacing it, and releasing its %d other"
                    " deliveries", child.pid, why, len(child.deliveries),
                    extra={"event": "worker_replace_asked", "worker_pid": child.pid, "reason": why})
        self.stats.children_killed += 1
        self.replace_and_release(child, f"worker pid {child.pid} replaced: {why}", now)

    def started(self, child: Child, message: FromChild) -> None:
        """A child's first message: it loaded the app and may take deliveries, or it could not."""
        match message:
            case Ready():
                loaded_s = time.monotonic() - child.launched
                log.info("worker %d is ready: it loaded the app in %.1f s", child.pid, loaded_s,
                         extra={"event": "worker_ready", "worker_pid": child.pid, "load_ms": int(loaded_s * 1000)})
                child.ready, child.start_deadline = True, None
                self.ever_ready = True
                self.start_deaths = 0
                self.claim_wanted = True
                self.worker_serves(child, message.workflows, message.queues, message.defaults, message.schedules)
                self.worker_schedules(child, message.schedules, time.monotonic())
                if not self.all_up and self.pool.up == self.pool.size:
                    self.all_up = True
                    up_s = time.monotonic() - self.pool.started_at
                    log.info("workers %d/%d up, %.1f s after the start", self.pool.size, self.pool.size, up_s,
                             extra={"event": "workers_up", "workers": self.pool.size, "up_ms": int(up_s * 1000)})
                return
            case LedgerNotOpened():  # the ledger, not the app: the message says what to do
                self.fatal = self.fatal or LedgerUnusable(message.error)
                return
            case AppNotLoaded():
                error = message.error  # "cannot load app APP: CAUSE", then the child's traceback
            case _:
                error = f"a worker process sent {message!r} before reporting that it loaded the app"
        if not self.ever_ready:
            raise AppLoadFailed(error)
        # The app no longer loads (edited on disk?). A replacement would fail alike: run on with
        # the children that remain, and stop only when none does.
        log.error("%s\nrunning with 1 worker fewer", error, extra={"event": "worker_app_not_loaded",
                                                                    "worker_pid": child.pid})
        self.pool.size -= 1
        self.pool.remove(child)
        if not self.pool.children:
            raise AppLoadFailed(error)

    def child_died(self, child: Child) -> None:
        # What it said before it died still counts: a delivery it reported done is settled.
        try:
            while child.ready and child.deliveries and child.conn.poll(0):
                message = child.conn.recv()
                if isinstance(message, Done):
                    self.done(child, message, time.monotonic())
        except (EOFError, OSError):
            pass
        child.process.join(1)
        delivery = child.delivery
        self.stats.child_deaths += 1
        if self.shared and child.deliveries:
            self.replace_and_release(child, f"worker pid {child.pid} {describe_exit(child.process)} mid-delivery",
                                     time.monotonic())
            return
        if delivery is not None:
            log.warning("execution %s token %d: worker pid %d %s mid-delivery; its lease is left to expire",
                        delivery.lease.execution_id, delivery.lease.token, child.pid, describe_exit(child.process),
                        extra={"event": "worker_died", "worker_pid": child.pid, "exit": describe_exit(child.process),
                               **delivery.log_fields})
            self.metrics.ended(delivery, "crashed", time.monotonic())
        elif not child.ready:
            log.warning("worker pid %d %s while loading the app; replacing it", child.pid, describe_exit(child.process),
                        extra={"event": "worker_died", "worker_pid": child.pid, "exit": describe_exit(child.process)})
            self.start_deaths += 1
            if not self.ever_ready and self.start_deaths >= START_ATTEMPTS * self.pool.size:
                raise DiedWhileStarting(f"a worker process died while starting, {self.start_deaths} times in a row"
                                        f" (last: {describe_exit(child.process)})")
        else:
            log.warning("idle worker pid %d %s; replacing it", child.pid, describe_exit(child.process),
                        extra={"event": "worker_died", "worker_pid": child.pid, "exit": describe_exit(child.process)})
        child.delivery = None
        self.replace(child)

    def replace(self, child: Child) -> None:
        """Kill `child` (confirmed gone) and start another in its place, unless stopping. A child
        that cannot be started (no memory, no more processes) is tried again by `top_up`."""
        if self.grace_deadline is not None:
            self.pool.remove(child)
            return
        try:
            self.pool.replace(child, wait=False)  # its successor is forked by `top_up`
        except OSError as exc:
            log.error("could not replace a worker: %s", exc, extra={"event": "worker_start_failed"})
            if child in self.pool.children:
                self.pool.children.remove(child)

    def replace_and_release(self, child: Child, why: str, now: float) -> None:
        """Kill `child`, make sure it is gone, start another in its place, and give back the
        lease of every delivery it held, so that each is delivered again at once instead of after
        its lease expires. (A release is fenced: one whose lease is lost already is refused, and
        counted lost.)"""
        deliveries = list(child.deliveries.values())
        child.deliveries = {}
        self.replace(child)  # killed and joined: it can write nothing more
        for delivery in deliveries:
            log.warning(RELEASE_LINE, delivery.lease.execution_id, delivery.lease.token, why,
                        extra={"event": "delivery_released", "reason": why, **delivery.log_fields})
            self.end(delivery, Retry(why), now)

    def top_up(self, now: float) -> None:
        """Start the children the pool lacks (at start-up, and after a start that failed), and
        now and then wait for the orphans of dead workers that exited (`Pool.reap_orphans`)."""
        if now >= self.next_orphan_check:
            self.next_orphan_check = now + ORPHAN_CHECK_S
            self.pool.reap_orphans()
        if self.grace_deadline is not None or now < self.next_top_up:
            self.topping_up = False
            return
        try:
            # Within a budget: the loop comes back for more at once (`deadline`) while the pool
            # lacks workers it may start now.
            started = self.pool.top_up(budget_s=TOP_UP_BUDGET_S, wait=False)
            self.topping_up = self.pool.forking or (started > 0 and len(self.pool.children) < self.pool.size)
            if self.pool.forking:  # the template's answer is looked for again shortly
                self.next_top_up = now + FORK_POLL_S
        except OSError as exc:
            self.topping_up = False
            log.error("could not start a worker, will try again in %.0f s: %s", TOP_UP_RETRY_S, exc,
                      extra={"event": "worker_start_failed"})
            self.next_top_up = now + TOP_UP_RETRY_S
