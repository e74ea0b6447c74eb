"""The invariant checker: reads a ledger and the workflows' own evidence, and says what broke.

It trusts nothing the supervisors think; it reads only

- the ledger (`executions`, `lease_history`, `steps`, `effects`, `stores`, `store_receipts`,
  `starts`, `messages`), read-only and from one snapshot, a SQLite file or a PostgreSQL database alike
  (`ledger_reads`: the same statements on both);
- the step log and the external system's log that `worker.apps.chaos` leaves in the work folder,
  and the log of the messages the harness sent (`sender`);
- the supervisors' logs (to count stale writes that were refused, and to know which deliveries
  their workers and they gave up on for want of heartbeats);
- the harness's samples of how long each supervisor and worker waited for a CPU (`cpu_waits`),
  to tell a holder the machine starved from one that stopped renewing on its own;
- the fault journal, the fleet journal (which supervisor had which pid and clock skew, and when
  it lived), the lock holders' log and the run's `config.json`: to set times of skewed clocks
  beside each other (`clocks`) and to tell which lost leases the faults explain (`takeovers`).

The generic checks hold for any ledger, whatever its workflows; the others apply to executions
of `chaos.mixed`, whose plans (their input) say which step keys are which kind of operation.

Invariants and how each is read (the kind names appear in `violations`):

- every execution is terminal (`not_terminal`: stuck or lost);
- lease history: the tokens of an execution are exactly 1..n, claimed in order, n its final
  token (`token_sequence`); no two live leases overlap, a lease being live from its claim to
  the earlier of its end and its expiry (`lease_overlap`);
- the outcome came from the current holder: the only delivery acknowledged with a terminal
  outcome is the last one, with the execution's final token and status
  (`stale_acknowledgement`, `missing_acknowledgement`), and the token the workflow itself wrote
  into its result or error is that final token (`outcome_token`);
- step records were never changed or written by a stale holder: one row per (execution, step,
  attempt) (`duplicate_step`); its token lies in 1..n and its write time within that token's
  delivery, give or take `late_write_tolerance_ms` of lock waits (`step_outside_lease`); in
  write order an execution's step tokens never go down (`stale_step_write`); a delivery that
  ran a step (a `begin` line) found no recorded result for it, so a result recorded under an
  older token must have been written after a newer claim (`stale_step_write`); a recorded value
  names the token that wrote it and matches a real run of the step (`step_value_unexplained`);
  every value any delivery continued with (`saw` lines, and the result's fingerprints) equals
  the recorded one (`step_value_changed`); no timer fired early (`timer_early`);
- effects ran once per effect id at the external system (`effect_executed_twice`), and the
  ledger kept that run's receipt (`effect_result_mismatch`, `effect_unsettled`);
- stores changed exactly once per step: the counter equals the number of increments recorded,
  each increment saw a distinct value (`counter_mismatch`); every mailbox item put was taken
  once or is still there (`mailbox_mismatch`);
- a parent saw its child's recorded result (`child_result_mismatch`);
- no execution failed by an infrastructure error (`failed_by_infrastructure`): every failed
  execution's error is one the workload plans (a `ChaosFailure`: a deliberate failure its input
  asks for, or a step that failed for good with a planned error: a flaky step's
  `RetryableError`, or a child's planned failure), every step error recorded is planned too, and
  no error names the storage (sqlite, disk, database, locked, or a `StorageError` class);
- no lease superseded while its holder was alive (`superseded_while_alive`): every takeover is
  explained by a fault, or by a holder the machine kept off the CPU (see `takeovers`);
- every effect id and every start-request id belongs to one execution (`effect_id_shared`,
  `start_id_shared`): no effect id was recorded or asked for at the external system by two
  (execution, step) pairs, and no child was recorded by two starts or runs another start's plan;
- no message sent to a `chaos.messages` execution was lost, taken twice or taken out of order, and
  none stored twice for a repeated send (`message_lost`, `message_taken_twice`, `message_mismatch`,
  `message_order`, `message_stored_twice`, `message_refused`; see `message_checks`);
- no claim of a limited queue's execution passed the queue's limits (`queue_concurrency`,
  `queue_per_key`, `queue_rate`): counting the live leases and the claims in the rate window that
  each claim had to count (`queue_limits`); the figures give each queue's largest counts beside
  its limits.

Lease and timer times are compared in true time, each taken back from its writer's clock skew.

With `--hosts`, the figures add, per host: the leases its supervisors held, those lost to a
partition or a freeze of the host (superseded deliveries that `takeovers` explains so), and the
stale operations refused once it was joined again (the refusals its supervisors logged for those
deliveries); and the takeover times after a partition and after a frozen host.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from worker.apps.chaos import digest

from ..ledger.errors import YieldstarError
from ..ledger.values import OUTCOME_STATUSES
from .clocks import Clocks
from .cpu_waits import read_cpu_waits
from .evidence import (
    read_fault_journal,
    read_faults,
    read_fleet,
    read_heartbeat_losses,
    read_lock_holds,
    read_refusals,
    read_run_config,
    read_sends,
    read_step_log,
    read_worker_ends,
)
from .failures import CHAOS_WORKFLOWS, TOKEN_IN_ERROR, FailureChecks
from .ledger_reads import POSTGRES, LedgerReader, open_reader
from .message_checks import check_messages
from .queue_limits import POSTGRES_END_SLACK_MS, QueueLimits, check_queue_limits
from .recorded import MISSING, plan_keys, value_of
from .sharing import SharingChecks
from .takeovers import TAKEN_OVER, check_takeovers
from .timeline import TimelineBuilder

# A step write samples its time before it waits for the write lock, and so does the claim that
# ends the previous holder's delivery; either may wait out a held lock (up to the busy timeout,
# 15 s) or a frozen process. Beyond this much, a write outside its delivery is reported.
LATE_WRITE_TOLERANCE_MS = 30_000
DETAILS_PER_KIND = 25


@dataclass
class Violation:
    kind: str
    execution_id: Optional[str]
    detail: str

    def as_dict(self) -> dict:
        return {"kind": self.kind, "execution_id": self.execution_id, "detail": self.detail}


@dataclass
class CheckResult:
    """What the checker found: figures by section, and every violation (details capped per kind)."""

    figures: dict = field(default_factory=dict)
    violation_counts: Counter = field(default_factory=Counter)
    violations: list = field(default_factory=list)
    timeline: Optional[dict] = None  # what happened when, for the report's page (`timeline`); not in as_dict

    def violate(self, kind: str, execution_id: Optional[str], detail: str) -> None:
        self.violation_counts[kind] += 1
        if self.violation_counts[kind] <= DETAILS_PER_KIND:
            self.violations.append(Violation(kind, execution_id, detail))

    @property
    def total_violations(self) -> int:
        return sum(self.violation_counts.values())

    @property
    def all_terminal(self) -> bool:
        counts = self.figures.get("executions", {})
        return counts.get("admitted", 0) > 0 and counts.get("not_terminal", 1) == 0

    @property
    def ok(self) -> bool:
        return self.total_violations == 0 and self.all_terminal

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "total_violations": self.total_violations,
            "violations_by_kind": dict(sorted(self.violation_counts.items())),
            "violations": [v.as_dict() for v in self.violations],
            **self.figures,
        }


# -- the checks --------------------------------------------------------------------------------

class Checker(SharingChecks, FailureChecks):
    def __init__(self, db_path: str, folder: Optional[str] = None, *,
                 late_write_tolerance_ms: int = LATE_WRITE_TOLERANCE_MS):
        self.db_path = db_path
        self.folder = folder
        self.tolerance = late_write_tolerance_ms
        self.result = CheckResult()
        self.clocks = Clocks(read_fleet(folder) if folder is not None else None)
        self.step_pids: dict[tuple[str, int], set] = defaultdict(set)  # workers that logged each delivery
        self.takeover_reasons: dict[tuple[str, int], Optional[str]] = {}  # superseded delivery -> why

    def run(self) -> CheckResult:
        reader = open_reader(self.db_path)
        try:
            with reader.snapshot():  # every table from one snapshot
                self._load(reader)
        finally:
            reader.close()
        self._check_executions()
        self._check_history()
        self._check_outcomes()
        self._check_steps()
        if self.folder is not None:
            self._check_step_log()
            self._check_effects()
        self._check_stores()
        self._check_children()
        self._check_failures()
        self._check_queue_limits()
        self._check_messages()
        if self.folder is not None:
            self._check_takeovers()
            self._count_refusals()
            self.result.figures["faults"] = read_faults(self.folder)
            self.result.timeline = self._timeline()
        return self.result

    def _load(self, conn: LedgerReader) -> None:
        self.executions = {
            row[0]: row for row in conn.rows(
                "SELECT execution_id, workflow, input_json, status, token, lease_expires_at, result_json,"
                " error_json, unacknowledged_deliveries, due_at FROM executions")
        }
        self.history: dict[str, list] = defaultdict(list)
        for row in conn.rows("SELECT execution_id, token, holder, claimed_at, expires_at, ended_at, ended_by,"
                                " outcome FROM lease_history ORDER BY execution_id, token"):
            self.history[row[0]].append(row)
        self.steps: dict[str, list] = defaultdict(list)
        for row in conn.rows("SELECT $row_order, execution_id, step_key, attempt, done, step_response_json, token,"
                                " written_at FROM steps ORDER BY $row_order"):
            self.steps[row[1]].append(row)
        self.duplicate_steps = conn.rows(
            "SELECT execution_id, step_key, attempt, count(*) FROM steps GROUP BY 1, 2, 3 HAVING count(*) > 1")
        self.effects = {row[0]: row for row in conn.rows(
            "SELECT effect_id, status, result_json, begun FROM effects")}
        self.stores = {row[0]: row[1] for row in conn.rows("SELECT name, state_json FROM stores")}
        self.receipts: dict[str, list] = defaultdict(list)
        for row in conn.rows("SELECT store, execution_id, step_key, result_json FROM store_receipts"):
            self.receipts[row[0]].append(row)
        self.starts = conn.rows("SELECT start_request_id, execution_id FROM starts")
        self.messages = conn.rows("SELECT execution_id, message_id, topic, seq, message_json, sent_at, taken_step,"
                                  " taken_at FROM messages")
        self.queue_limits = {row[0]: QueueLimits(*row) for row in conn.rows(
            "SELECT name, concurrency, per_key, rate_count, rate_ms FROM queues")}
        self.queue_of = {row[0]: (row[1], row[2]) for row in conn.rows(
            "SELECT execution_id, queue, queue_key FROM executions")}
        self.backend_kind = conn.kind
        self.children = {child for _, child in self.starts}
        self.plans = {eid: plan_keys(row[2]) for eid, row in self.executions.items() if row[1] in CHAOS_WORKFLOWS}
        # The recorded outcome of each step: the done row (the highest attempt is the done one).
        self.recorded: dict[tuple[str, str], tuple] = {}
        for eid, rows in self.steps.items():
            for row in rows:
                if row[4]:
                    self.recorded[(eid, row[2])] = row

    # -- executions and leases -----------------------------------------------------------------

    def _check_executions(self) -> None:
        statuses = Counter(row[3] for row in self.executions.values())
        not_terminal = [row for row in self.executions.values() if row[3] not in OUTCOME_STATUSES]
        for row in not_terminal:
            self.result.violate("not_terminal", row[0], f"status {row[3]}, token {row[4]}, due_at {row[9]},"
                                f" unacknowledged deliveries {row[8]}")
        roots = sum(1 for eid in self.executions if eid not in self.children)
        self.result.figures["executions"] = {
            "admitted": len(self.executions), "admitted_by_harness": roots,
            "started_by_workflows": len(self.executions) - roots,
            "completed": statuses.get("completed", 0), "failed": statuses.get("failed", 0),
            "not_terminal": len(not_terminal),
            "deliveries": sum(len(h) for h in self.history.values()),
        }

    def _check_history(self) -> None:
        overlaps = acknowledged = 0
        ends = Counter()
        true_ms = self.clocks.true_ms
        for eid, row in self.executions.items():
            history = self.history.get(eid, [])
            tokens = [h[1] for h in history]
            if tokens != list(range(1, row[4] + 1)):
                self.result.violate("token_sequence", eid, f"lease history tokens {tokens[:20]} but the final"
                                    f" token is {row[4]}")
            live_until = None  # the latest true moment any earlier lease was live
            previous = None
            for i, h in enumerate(history):
                _, token, holder, claimed_at, expires_at, ended_at, ended_by, outcome = h
                ends[ended_by or "open"] += 1
                claimed = true_ms(holder, claimed_at)
                if previous is not None and claimed < previous[1]:
                    self.result.violate("token_sequence", eid, f"token {token} claimed at {claimed}, before"
                                        f" token {previous[0]} ({previous[1]}, true ms)")
                if live_until is not None and claimed < live_until[0]:
                    overlaps += 1
                    self.result.violate("lease_overlap", eid, f"token {token} ({holder}) claimed at {claimed}"
                                        f" while token {live_until[1]} was live until {live_until[0]} (true ms)")
                if ended_by is None and token == row[4] and row[5] is not None:
                    expires_at = row[5]  # the live lease: its expiry is kept on the execution
                if ended_at is not None and ended_by in ("acknowledged", "released"):
                    end = true_ms(holder, min(ended_at, expires_at))  # its holder ended it, by its clock
                elif i + 1 < len(history):
                    # Expired, then claimed: the claimer's clock said when. A claimer whose clock runs
                    # ahead sees a lease end early by its skew; that is the clock's say, not an overlap.
                    end = true_ms(history[i + 1][2], expires_at)
                else:
                    end = true_ms(holder, expires_at)
                if live_until is None or end > live_until[0]:
                    live_until = (end, token)
                if ended_by is None and token != row[4]:
                    self.result.violate("token_sequence", eid, f"token {token} never ended, yet token {row[4]}"
                                        " was claimed after it")
                if ended_by == "acknowledged" and outcome in OUTCOME_STATUSES:
                    acknowledged += 1
                    if token != row[4] or outcome != row[3]:
                        self.result.violate("stale_acknowledgement", eid, f"token {token} ({holder}) acknowledged"
                                            f" {outcome}; the execution's final token is {row[4]}, status {row[3]}")
                previous = (token, claimed)
            if row[3] in OUTCOME_STATUSES:
                last = history[-1] if history else None
                if last is None or last[6] != "acknowledged" or last[7] != row[3] or last[1] != row[4]:
                    self.result.violate("missing_acknowledgement", eid, f"status {row[3]} with token {row[4]},"
                                        f" but its last delivery reads {last[1:] if last else None}")
        for eid in set(self.history) - set(self.executions):
            self.result.violate("token_sequence", eid, "lease history of an execution that does not exist")
        self.result.figures["leases"] = {"deliveries_by_end": dict(sorted(ends.items())),
                                         "terminal_acknowledgements": acknowledged, "overlaps": overlaps}

    def _check_outcomes(self) -> None:
        checked = 0
        for eid, row in self.executions.items():
            if row[1] not in CHAOS_WORKFLOWS or row[3] not in OUTCOME_STATUSES:
                continue
            checked += 1
            if row[3] == "completed":
                result = json.loads(row[6])
                if not isinstance(result, dict):
                    result = {}
                token = result.get("token")
                for key, fingerprint in (result.get("seen") or {}).items():
                    recorded = self._recorded_value(eid, key)
                    if recorded is not MISSING and digest(recorded) != fingerprint:
                        self.result.violate("step_value_changed", eid, f"the result says step {key} gave"
                                            f" {fingerprint}; the ledger records {digest(recorded)}")
            else:
                error = json.loads(row[7])
                found = TOKEN_IN_ERROR.search(error.get("message", "")) if isinstance(error, dict) else None
                token = int(found.group(1)) if found else None
            if token != row[4]:
                self.result.violate("outcome_token", eid, f"the {row[3]} outcome was produced under token {token};"
                                    f" the execution's final token is {row[4]}")
        self.result.figures["outcomes_checked"] = checked

    # -- steps ---------------------------------------------------------------------------------

    def _delivery_window(self, eid: str, token: int) -> Optional[tuple[int, Optional[int]]]:
        history = self.history.get(eid, [])
        if not 1 <= token <= len(history) or history[token - 1][1] != token:
            return None
        h = history[token - 1]
        if h[6] in ("acknowledged", "released"):
            return h[3], h[5]
        if token < len(history):  # superseded: it ended when the next claim took over
            return h[3], history[token][3]
        return h[3], None

    def _check_steps(self) -> None:
        for eid, key, attempt, n in self.duplicate_steps:
            self.result.violate("duplicate_step", eid, f"step {key} attempt {attempt} has {n} records")
        rows = 0
        for eid, steps in self.steps.items():
            execution = self.executions.get(eid)
            final = execution[4] if execution else 0
            highest = 0
            plan = self.plans.get(eid, {})
            for rowid, _, key, attempt, done, response, token, written_at in steps:
                rows += 1
                if not 1 <= token <= final:
                    self.result.violate("step_outside_lease", eid, f"step {key} attempt {attempt} written under"
                                        f" token {token}; the final token is {final}")
                window = self._delivery_window(eid, token)
                if window is not None:
                    start, end = window
                    if written_at < start - 1000 or (end is not None and written_at > end + self.tolerance):
                        self.result.violate("step_outside_lease", eid, f"step {key} attempt {attempt} written at"
                                            f" {written_at} under token {token}, whose delivery ran {start}..{end}")
                if token < highest:
                    self.result.violate("stale_step_write", eid, f"step {key} attempt {attempt} written under"
                                        f" token {token} after a write under token {highest}")
                highest = max(highest, token)
                op = plan.get(key)
                if done and op is not None and op[0] in ("run", "retry"):
                    ok, value = value_of(response)
                    if ok and (not isinstance(value, dict) or value.get("token") != token):
                        self.result.violate("step_value_unexplained", eid, f"step {key} was written under token"
                                            f" {token} but holds a value produced under {value}")
        self.result.figures["steps"] = {"records": rows}

    def _check_step_log(self) -> None:
        ends = set()
        runs = Counter()
        seen_lines = 0
        begins = []
        for line in read_step_log(self.folder):
            self.step_pids[(line.execution_id, line.token)].add(line.pid)
            if line.event == "begin":
                runs["begun"] += 1
                begins.append(line)
            elif line.event == "end":
                ends.add((line.execution_id, line.token, line.pid, line.key, line.extra))
                runs["returned"] += 1
            elif line.event == "fail":
                runs["retryable_errors"] += 1
            elif line.event == "saw":
                seen_lines += 1
                recorded = self._recorded_value(line.execution_id, line.key)
                op = self.plans.get(line.execution_id, {}).get(line.key)
                if recorded is MISSING:
                    self.result.violate("step_value_changed", line.execution_id, f"token {line.token} continued"
                                        f" past step {line.key} with {line.extra}, which the ledger does not record")
                elif digest(recorded) != line.extra:
                    self.result.violate("step_value_changed", line.execution_id, f"token {line.token} continued"
                                        f" past step {line.key} with {line.extra}; the ledger records"
                                        f" {digest(recorded)}")
                elif op is not None and op[0] == "sleep":
                    row = self.recorded[(line.execution_id, line.key)]
                    until = json.loads(row[5])["until"]
                    # `until` and the due check are ledger times; the log's time is the worker's wall
                    # clock. The clock that decided "due" is the delivery's: its supervisor's, skew
                    # and all (with --hosts, the server's, while the host's wall clock is skewed).
                    at = line.time_ns // 1_000_000 + self._skew_of(line.execution_id, line.token)
                    if at < until:
                        self.result.violate("timer_early", line.execution_id, f"timer {line.key} set for {until}"
                                            f" let token {line.token} continue at {at} (by its clock)")
        for line in begins:
            row = self.recorded.get((line.execution_id, line.key))
            if row is not None and row[6] < line.token:
                # Token line.token ran the step, so when its delivery read the records there was no
                # result; one recorded under an older token came in after a newer claim.
                self.result.violate("stale_step_write", line.execution_id, f"step {line.key} is recorded under"
                                    f" token {row[6]}, but token {line.token} found no record and ran it")
        for (eid, key), row in self.recorded.items():
            op = self.plans.get(eid, {}).get(key)
            if op is None or op[0] not in ("run", "retry"):
                continue
            ok, value = value_of(row[5])
            if ok and isinstance(value, dict) and \
                    (eid, value.get("token"), value.get("pid"), key, value.get("nonce")) not in ends:
                self.result.violate("step_value_unexplained", eid, f"step {key} records {value}, which no run of"
                                    " the step returned")
        runs["values_seen"] = seen_lines
        self.result.figures["steps"].update(dict(runs))

    def _skew_of(self, eid: str, token: int) -> int:
        """How far the ledger clock of delivery `token` of `eid` (its supervisor's and its workers')
        runs ahead of its workers' wall clock, which times the step log."""
        history = self.history.get(eid, [])
        if not 1 <= token <= len(history):
            return 0
        h = history[token - 1]
        return self.clocks.skew(h[2], h[3]) - self.clocks.wall_skew(h[2], h[3])

    def _check_queue_limits(self) -> None:
        live_expiry = {eid: (row[4], row[5]) for eid, row in self.executions.items()}
        self.result.figures["queues"] = check_queue_limits(
            self.queue_limits, self.queue_of, self.history, live_expiry, self.clocks, self.result.violate,
            end_slack_ms=POSTGRES_END_SLACK_MS if self.backend_kind == POSTGRES else 0)

    def _check_messages(self) -> None:
        sends = read_sends(self.folder) if self.folder is not None else None
        self.result.figures["messages"] = check_messages(self.executions, self.messages, self.recorded, self.history,
                                                         sends, self.clocks, self.result.violate)

    def _check_takeovers(self) -> None:
        config = read_run_config(self.folder)
        if not self.clocks.known or config is None:
            self.result.figures["takeovers"] = {"checked": False,
                                                "why": "no fleet journal or config.json in the work folder"}
            return
        worker_ends = read_worker_ends(self.folder)
        figures, self.takeover_reasons = check_takeovers(
            self.history, read_fault_journal(self.folder), read_lock_holds(self.folder), self.clocks, self.step_pids,
            lease_ms=config["lease_ms"], renew_ms=config["renew_ms"], violate=self.result.violate,
            cpu_waits=read_cpu_waits(self.folder), heartbeat_losses=frozenset(read_heartbeat_losses(self.folder)),
            worker_ends=worker_ends, shared=bool(config.get("workers")))
        figures["workers"] = worker_ends.figures()
        skews = self.clocks.skews()
        figures["clocks"] = {"supervisors": len(skews), "skewed": sum(1 for k in skews if k),
                             "min_skew_ms": min(skews, default=0), "max_skew_ms": max(skews, default=0)}
        self.result.figures["takeovers"] = {"checked": True, **figures}

    def _count_refusals(self) -> None:
        """Refused operations by kind, and how many of them came after another holder took over
        (the token's delivery was superseded); the rest raced their own holder's end (a renewal
        just after its acknowledgement)."""
        refusals, tracebacks = read_refusals(self.folder)
        kinds = ("worker_writes", "renewals", "ended_in_ledger", "deliveries_lost")
        figures: dict = {kind: {"total": 0, "after_takeover": 0} for kind in kinds}
        for kind, eid, token, _ in refusals:
            history = self.history.get(eid, [])
            superseded = 1 <= token < len(history) and history[token - 1][6] in TAKEN_OVER
            figures[kind]["total"] += 1
            figures[kind]["after_takeover"] += superseded
        figures["total"] = sum(f["total"] for f in figures.values())
        figures["tracebacks_in_logs"] = tracebacks
        self.result.figures["stale_refused"] = figures
        if any(life.host is not None for life in self.clocks.lives()):
            self.result.figures["hosts"] = self._by_host(refusals)

    def _by_host(self, refusals: list) -> dict:
        """Per host (`--hosts`): the leases its supervisors held, those lost to a partition or a
        freeze of the host, and the stale operations refused after it healed (or thawed): worker
        writes, renewals and settlements of deliveries that the host fault cost."""
        host_of = {life.number: life.host for life in self.clocks.lives()}
        hosts: dict = {host: {"supervisors": 0, "leases_held": 0, "lost_to_partition": 0, "lost_to_freeze": 0,
                              "stale_refused_after_partition": 0, "stale_refused_after_freeze": 0}
                       for host in sorted(set(host_of.values()))}
        for life in self.clocks.lives():
            hosts[life.host]["supervisors"] += 1
        reasons = self.takeover_reasons
        lost_to = {"holder_partitioned": "partition", "host_frozen": "freeze"}
        for eid, rows in self.history.items():
            for _, token, holder, claimed_at, *_ in rows:
                life = self.clocks.life(holder, claimed_at)
                if life is None:
                    continue
                hosts[life.host]["leases_held"] += 1
                fault = lost_to.get(reasons.get((eid, token)))
                if fault:
                    hosts[life.host][f"lost_to_{fault}"] += 1
        for _, eid, token, number in refusals:
            fault = lost_to.get(reasons.get((eid, token)))
            if fault and number in host_of:
                hosts[host_of[number]][f"stale_refused_after_{fault}"] += 1
        return hosts

    def _timeline(self) -> dict:
        config = read_run_config(self.folder) or {}
        return TimelineBuilder(
            history=self.history, executions=self.executions, clocks=self.clocks,
            faults=read_fault_journal(self.folder), lock_holds=read_lock_holds(self.folder),
            step_pids=self.step_pids, reasons=self.takeover_reasons, violations=self.result.violations,
            lease_ms=config.get("lease_ms", 0)).build()


def check(db_path: str, folder: Optional[str] = None, *,
          late_write_tolerance_ms: int = LATE_WRITE_TOLERANCE_MS) -> CheckResult:
    """Check a ledger (and, given the work folder of a chaos run, its evidence)."""
    return Checker(db_path, folder, late_write_tolerance_ms=late_write_tolerance_ms).run()


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m supervisor.chaos LEDGER [--folder DIR] [--json]`: exit 0 iff it holds, 2 (with
    one line on stderr) if the ledger cannot be read."""
    parser = argparse.ArgumentParser(prog="python -m supervisor.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("db", help="the ledger: a SQLite file or a postgresql:// URI")
    parser.add_argument("--folder", help="the chaos run's work folder (step log, external system, logs)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = parser.parse_args(argv)
    from .report import summary_lines
    try:
        result = check(args.db, args.folder)
    except YieldstarError as exc:
        print(f"python -m supervisor.chaos: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print("\n".join(summary_lines({"check": result.as_dict()})))
    return 0 if result.ok else 1
