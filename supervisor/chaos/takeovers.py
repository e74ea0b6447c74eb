"""Which takeovers the faults explain: the `superseded_while_alive` check.

A delivery is *superseded* when another claim took its execution after its lease expired: its
holder stopped renewing for a whole lease. That is the runtime working as designed when the
holder was dead, frozen or stopping, when the worker running the delivery was killed or frozen,
when nobody could write to the ledger for longer than the lease had left, or when the machine did
not give the holder a CPU. Anything else is a live holder losing a lease it was entitled to keep
(a blocked heartbeat, a claim handed to a dead worker and never released, a renewer that fell
behind) and is reported.

A delivery of a queue whose limits count live leases may also end *expired* before the next
claim of its execution: a claim of the same queue that counted its run-out lease free ends it
(`tables.leases.END_LAPSED`). It is checked as a superseded one is: its holder stopped renewing
for a whole lease all the same.

For each superseded delivery, in true time (see `clocks`):

    claimed      its claim                               (holder's clock)
    renewed      its last renewal: expires_at - lease    (holder's clock)
    expired      when the next claimer saw it expire: expires_at, by the claimer's clock

and it is explained by the first of these that fits (`SLACK_MS` either side of the first three, whose
times the harness takes a tick or so late):

- `holder_ended`: the holder's supervisor was killed, told to stop (a `term_supervisor`,
  `slow_start` or `clock_skew` fault), or exited, no later than `expired`;
- `holder_frozen`: a `freeze_supervisor` of the holder overlaps `renewed`..`expired`; the
  window runs one lease past the SIGCONT, because workers that gave up on their supervisor
  during the freeze leave their leases to expire after it;
- `worker_fault`: a `kill_child` or `freeze_child` hit the holder's worker that ran this
  delivery: the fault journal names the delivery (the step it hit), or the worker was killed
  or frozen while the delivery was live (between steps, or just after it moved on from the
  step the journal names; a freeze from before the claim counts while it lasts: a supervisor
  may hand a delivery to a worker it has not yet found silent) and no other worker ran it: none
  left lines for it in the step log, nor did its supervisor name another for it (`evidence.
  WorkerEnds`: the worker it told to stop the delivery, or replaced and released it with). With
  `--workers` one worker holds many deliveries, and a kill or a freeze of it explains each of
  them, the ones it was not inside a step of included; a delivery whose worker nothing names
  explains nothing there (its supervisor names the worker of every delivery it releases with
  one), and one whose worker was alive and heard explains nothing anywhere. Workers killed while a `slow_start` pool loads explain nothing:
  they never held a delivery, so a claim handed to one must be released at once. Unless the
  step log shows that the killed worker ran this delivery, and no other did: the kill landed
  after the worker had loaded the app and been handed the delivery (a harness slow to send it),
  which is a kill mid-delivery like any;
- `worker_replaced`: (`--workers`) the holder's supervisor replaced the delivery's worker because
  another delivery of it would not stop when told (a step that sleeps through its lost lease),
  and released this one with it, as the runtime does by design (SPEC section 10); the release may
  meet the lease expired when the supervisor was late;
- `stall`: a window in which nobody could write to the ledger (a held write lock, from the lock
  holder's own log; a full disk, from the burst's own times; windows less than a renewal
  interval apart merged) began no later than one renewal interval after `renewed` (it caught the
  renewal that was due next) and ended no earlier than one renewal interval before `expired`
  (the renewal, blocked until the window ended or failed and retried an interval later, could
  not have come in time). `STALL_SLACK_MS` either side: these times are measured exactly. So a
  window shorter than the lease minus two renewal intervals (minus the skew by which the claimer's
  clock runs ahead of the holder's) explains nothing, however it falls;
- `host_frozen`: (`--hosts`) a `frozen_host` of the holder's host caught the renewal that was due
  next (it began no later than one renewal interval after `renewed`, `SLACK_MS` allowed) and
  lasted until `renewed` at least; the window runs one lease past the SIGCONT, as for
  `holder_frozen`;
- `holder_partitioned`: (`--hosts`) a `partition` cut the holder's host off in the same way: the
  cut caught the renewal that was due next. The window runs from the cut to one lease past twice
  the cut's length after the heal: a renewal caught by the cut is retransmitted with TCP's
  doubling backoff, so it may reach the server as late as the cut lasted after the heal, and the
  workers that the supervisor stopped while it could not renew leave their leases to expire.
  A cut that came later than that explains nothing: the renewal due before it should have landed;
- `server_down`: (`--hosts`) a `server_restart`: from the fast shutdown's beginning to two renewal
  intervals after the server was up again (a renewal that failed while it was down is retried an
  interval later, on a new connection), judged as a `stall`;
- `claim_unanswered`: (PostgreSQL) a `connection_kill` terminated a runtime session within
  `SLACK_MS` of the claim (a `server_restart` terminates every session), and the lease was never
  renewed: a session killed while its claim commits leaves a claim that may have committed with a
  holder that was told it failed, and so never learns of its lease (the one ambiguity a broken
  connection leaves). A kill at any other moment explains nothing: the runtime retries the call
  that met it on a new connection;
- `holder_starved`: the machine kept the holder off the CPU. By the kernel's own count
  (`cpu_waits`, sampled by the harness), the threads of the holder's supervisor, or of a worker
  that ran the delivery (the step log's), waited for a CPU for at least half of what the lease had
  left once its next renewal was due, (`expired` - `renewed` - renewal interval) / 2 (600 ms at the
  defaults): counted from `renewed` to `expired`, when the renewal then due came too late; or
  from one lease before `renewed`, when the supervisor logged that this delivery's worker and it
  lost each other's heartbeats (it found the worker silent and killed it, or the worker left)
  and so left the lease to expire: three missed heartbeats fit in a lease, and the silence may end
  just before the last renewal lands. The runtime cannot tell a starved process from a frozen one.
  A thread blocked (on a lock, the database, a pipe) is not waiting for a CPU, so a holder stuck
  in its own code is still reported; so is every takeover of a run without the samples (a kernel
  that keeps no such count).

The takeover time after a partition (or a frozen host) is, for each delivery it explains, the
time from the cut (the SIGSTOP) to the next claim of its execution, both true times (the server's
clock, and the harness's, on one machine).

A clock skew is not an excuse of its own: the harness keeps any two clocks closer than half of
lease minus renewal interval, and `expired` is read on the claimer's clock, so a skew shortens
the lease a holder has left by exactly the skew, and every window above is judged with it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Optional

from .clocks import Clocks
from .cpu_waits import CpuWaits
from .evidence import WorkerEnds

SLACK_MS = 500
# How a delivery ends when another claim takes over from its holder (see the module docstring).
TAKEN_OVER = ("superseded", "expired")
STALL_SLACK_MS = 100
REASONS = ("holder_ended", "holder_frozen", "worker_fault", "worker_replaced", "stall", "host_frozen", "holder_partitioned",
           "server_down", "claim_unanswered", "holder_starved")
HOST_FAULTS = {"holder_partitioned": "partition", "host_frozen": "frozen_host"}  # reason -> the fault kind


def _merge(windows: list[tuple[int, int]], gap_ms: int) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1] + gap_ms:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


class Takeovers:
    """The faults of one run, indexed for the question "what made this delivery lose its lease"."""

    def __init__(self, faults: list[dict], lock_holds: dict, clocks: Clocks, *, lease_ms: int, renew_ms: int,
                 cpu_waits: Optional[CpuWaits] = None, heartbeat_losses: frozenset = frozenset(),
                 worker_ends: Optional[WorkerEnds] = None, shared: bool = False):
        self.clocks = clocks
        self.shared = shared  # `--workers`: each worker held several deliveries
        self.worker_ends = worker_ends or WorkerEnds({}, {}, Counter())
        self.lease_ms = lease_ms
        self.renew_ms = renew_ms
        self.cpu_waits = cpu_waits or CpuWaits({})
        self.heartbeat_losses = heartbeat_losses  # (execution, token): worker and supervisor lost each other
        self.ends: dict[int, int] = {}  # supervisor number -> when it began to end
        self.freezes: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.worker_faults: dict[int, list[dict]] = defaultdict(list)
        self.start_kills: dict[int, list[dict]] = defaultdict(list)  # slow_start replacement -> workers killed
        self.session_kills: list[int] = []
        # (`--hosts`) supervisor number -> [(from, to)] of its host's cuts and freezes, and when
        # the server was down
        self.host_windows: dict[str, dict[int, list[tuple[int, int]]]] = {
            reason: defaultdict(list) for reason in HOST_FAULTS}
        self.server_down: list[tuple[int, int]] = []
        self.takeover_ms: dict[str, list[int]] = {kind: [] for kind in HOST_FAULTS.values()}
        stalls = []
        for fault in faults:
            kind, at, target, params = fault["kind"], fault.get("at_ms", 0), fault.get("target", {}), fault["params"]
            number = target.get("supervisor")
            if kind in ("kill_supervisor", "term_supervisor", "slow_start", "clock_skew") and number is not None:
                self.ends[number] = min(self.ends.get(number, at), at)
                if kind == "slow_start":
                    self.start_kills[target.get("replacement")].extend(params.get("workers_killed", []))
            elif kind == "freeze_supervisor":
                self.freezes[number].append((at, at + int(params.get("seconds", 0) * 1000) + lease_ms))
            elif kind in ("kill_child", "freeze_child"):
                self.worker_faults[number].append(fault)
            elif kind == "hold_write_lock":
                held = lock_holds.get(target.get("pid"))
                if held is not None:
                    start, end = held
                    stalls.append((start, end if end is not None else start + int(params["seconds"] * 1000)))
                else:  # the holder never logged the lock: the longest it may have held it
                    stalls.append((at, at + int(params["seconds"] * 1000) + SLACK_MS))
            elif kind == "connection_kill":
                self.session_kills.append(at)
            elif kind == "disk_full" and params.get("filling_ms"):
                stalls.append((params["filling_ms"], params["freed_ms"]))
            elif kind == "partition":
                healed = params.get("healed_ms") or at + int(params["seconds"] * 1000)
                for number in target.get("supervisors", []):
                    self.host_windows["holder_partitioned"][number].append((at, healed + (healed - at) + lease_ms))
            elif kind == "frozen_host":
                for number in target.get("supervisors", []):
                    self.host_windows["host_frozen"][number].append(
                        (at, at + int(params.get("seconds", 0) * 1000) + lease_ms))
            elif kind == "server_restart":
                up = params.get("started_ms") or at + 60_000  # never up again: the run fails anyway
                self.server_down.append((params.get("began_ms", at), up + 2 * renew_ms))
                self.session_kills.append(params.get("began_ms", at))
        self.stalls = _merge(stalls, renew_ms)

    def explain(self, eid: str, token: int, holder: str, claimed_at: int, expires_at: int, next_holder: str,
                step_pids: set, taken_at: Optional[int] = None) -> Optional[str]:
        """Why delivery `token` of `eid` was superseded, or None if no fault explains it.

        `step_pids`: the workers that left lines in the step log for this delivery; `taken_at`:
        when the next claim took it (true ms), for the takeover times after host faults."""
        life = self.clocks.life(holder, claimed_at)
        if life is None:
            return None
        step_pids = step_pids | self.worker_ends.workers.get((eid, token), set())
        claimed = claimed_at - life.skew_ms
        renewed = expires_at - self.lease_ms - life.skew_ms
        expired = self.clocks.true_ms(next_holder, expires_at)
        ends = [t for t in (self.ends.get(life.number), life.ended_ms) if t is not None]
        if ends and min(ends) <= expired + SLACK_MS:
            return "holder_ended"
        for start, end in self.freezes.get(life.number, []):
            if start <= expired + SLACK_MS and end >= renewed - SLACK_MS:
                return "holder_frozen"
        for fault in self.worker_faults.get(life.number, []):
            step = fault.get("step")
            if step is not None and step.get("execution_id") == eid and step.get("token") == token:
                return "worker_fault"
            if [eid, token] in fault["target"].get("in_steps", []):  # --workers: one of the many it held
                return "worker_fault"
            # The step the journal names is the one the injector saw last; the worker may have
            # finished it and been handed the next delivery just before the signal landed.
            worker = fault["target"].get("worker_pid")
            # A frozen worker stays frozen: one frozen before the claim may have been handed
            # this delivery while its supervisor had not yet found it silent.
            thawed = fault["at_ms"] + int(fault["params"].get("seconds", 0) * 1000)
            if (fault["at_ms"] <= expired + SLACK_MS and thawed >= claimed - SLACK_MS and step_pids <= {worker}
                    and (step_pids or not self.shared)):
                return "worker_fault"
        released = self.worker_ends.released.get((eid, token))
        if released is not None and released[0] == life.number and released[2] == "sibling_unstoppable":
            return "worker_replaced"
        for kill in self.start_kills.get(life.number, []):
            # Sent to a worker that the harness saw still loading the app; one that ran this
            # delivery had loaded it and been handed the delivery before the signal landed.
            if step_pids == {kill["pid"]} and claimed - SLACK_MS <= kill["at_ms"] <= expired + SLACK_MS:
                return "worker_fault"
        if self._stalled(self.stalls, renewed, expired):
            return "stall"
        for reason, windows in self.host_windows.items():
            for start, end in windows.get(life.number, []):
                if start <= renewed + self.renew_ms + SLACK_MS and end >= renewed - SLACK_MS:
                    if taken_at is not None:
                        self.takeover_ms[HOST_FAULTS[reason]].append(taken_at - start)
                    return reason
        if self._stalled(self.server_down, renewed, expired):
            return "server_down"
        if renewed == claimed and any(abs(at - claimed) <= SLACK_MS for at in self.session_kills):
            return "claim_unanswered"
        waited, needed = self.starved(eid, token, life.pid, step_pids, renewed, expired)
        if waited >= needed:
            return "holder_starved"
        return None

    def starved(self, eid: str, token: int, supervisor_pid: int, step_pids: set, renewed: int,
                expired: int) -> tuple[int, int]:
        """At least how long the threads of the holder's supervisor, or of a worker that ran the
        delivery, waited for a CPU while it mattered (true ms), and how long would excuse the
        takeover (see `holder_starved` above)."""
        since = renewed - self.lease_ms if (eid, token) in self.heartbeat_losses else renewed
        waited = max(self.cpu_waits.starved_ms(pid, since, expired) for pid in (supervisor_pid, *step_pids))
        return waited, max(1, (expired - renewed - self.renew_ms) // 2)

    def _stalled(self, windows: list[tuple[int, int]], renewed: int, expired: int) -> bool:
        """A window caught the renewal due after `renewed` and lasted until too late for any."""
        return any(start <= renewed + self.renew_ms + STALL_SLACK_MS and end >= expired - self.renew_ms - STALL_SLACK_MS
                   for start, end in windows)

    def nearby(self, at_ms: int, faults: list[dict], within_ms: int = 3_000) -> str:
        close = [f"{f['kind']} at {f.get('at_ms', 0) - at_ms:+d} ms" for f in faults
                 if abs(f.get("at_ms", 0) - at_ms) <= within_ms]
        return ", ".join(close[:6]) or "none within 3 s"


def _spread(values: list[int]) -> dict:
    """Count, median, p99 and max of `values` (ms), by nearest rank."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    at = lambda share: ordered[min(len(ordered) - 1, max(0, -(-len(ordered) * share // 100) - 1))]  # noqa: E731
    return {"count": len(ordered), "median_ms": at(50), "p99_ms": at(99), "max_ms": ordered[-1]}


def check_takeovers(history: dict, faults: list[dict], lock_holds: dict, clocks: Clocks, step_pids: dict, *,
                    lease_ms: int, renew_ms: int, violate: Callable[[str, Optional[str], str], None],
                    cpu_waits: Optional[CpuWaits] = None, heartbeat_losses: frozenset = frozenset(),
                    worker_ends: Optional[WorkerEnds] = None, shared: bool = False) -> tuple[dict, dict]:
    """Report every superseded delivery that no fault, nor a starved holder, explains; return the
    figures, and the reason that explained each superseded delivery `(execution, token)` (None:
    unexplained)."""
    takeovers = Takeovers(faults, lock_holds, clocks, lease_ms=lease_ms, renew_ms=renew_ms, cpu_waits=cpu_waits,
                          heartbeat_losses=heartbeat_losses, worker_ends=worker_ends, shared=shared)
    reasons: Counter = Counter()
    by_delivery: dict[tuple[str, int], Optional[str]] = {}
    superseded = 0
    for eid, rows in history.items():
        for h, following in zip(rows, rows[1:]):
            _, token, holder, claimed_at, expires_at, _, ended_by, _ = h
            if ended_by not in TAKEN_OVER:
                continue
            superseded += 1
            reason = takeovers.explain(eid, token, holder, claimed_at, expires_at, following[2],
                                       step_pids.get((eid, token), set()), clocks.true_ms(following[2], following[3]))
            by_delivery[(eid, token)] = reason
            if reason is not None:
                reasons[reason] += 1
                continue
            reasons["unexplained"] += 1
            life = clocks.life(holder, claimed_at)
            who = (f"supervisor {life.number} (pid {life.pid}, clock {life.skew_ms:+d} ms)" if life is not None
                   else f"{holder}, which the fleet journal does not know")
            renewed = expires_at - lease_ms - (life.skew_ms if life else 0)
            expired = clocks.true_ms(following[2], expires_at)
            starved = ""
            if life is not None and takeovers.cpu_waits.known:
                waited, needed = takeovers.starved(eid, token, life.pid, step_pids.get((eid, token), set()), renewed,
                                                   expired)
                starved = f", having waited for a CPU for {waited} ms or more ({needed} would excuse it)"
            violate("superseded_while_alive", eid,
                    f"token {token} of {who} lost its lease: claimed at {clocks.true_ms(holder, claimed_at)},"
                    f" last renewed at {renewed}, expired for the next claimer at {expired} (true ms){starved};"
                    f" token {following[1]} took it at {clocks.true_ms(following[2], following[3])}. Faults near"
                    f" the expiry: {takeovers.nearby(expired, faults)}")
    figures = {"superseded": superseded, "explained": {r: reasons.get(r, 0) for r in REASONS},
               "unexplained": reasons.get("unexplained", 0),
               "cpu_waits_sampled": takeovers.cpu_waits.known,
               "stall_windows": len(takeovers.stalls),
               "longest_stall_ms": max((b - a for a, b in takeovers.stalls), default=0)}
    if any(f["kind"] in HOST_FAULTS.values() for f in faults):
        figures["takeover_after"] = {kind: _spread(times) for kind, times in takeovers.takeover_ms.items()}
    return figures, by_delivery
