"""Model-based test: random interleavings of ledger calls against a pure-Python model of SPEC §3.

`LedgerModel` is written from the text of SPEC section 3 alone (it knows nothing of the SQL
schema): each execution keeps its status as last written, its token, due time, lease expiry,
count of unacknowledged deliveries and when the last of them ended, whether a delivery was ever
acknowledged suspended, the earliest wake requested during the open delivery, its outcome, its
lease history and its recorded steps. "As of now" views are computed on read, as the spec
describes them.

The state machine drives the real SQLite backend (a fresh file per example) and the model side
by side, with one fake clock, and after every step checks the section 3 invariants on what the
backend reports plus exact agreement between backend and model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from supervisor import (
    Completed,
    ExecutionLease,
    ExecutionRecord,
    Failed,
    HeapRecord,
    LeaseLost,
    Released,
    Renewed,
    StepWrite,
    Suspended,
    open_backend,
)
from supervisor.ledger.errors import ExecutionConflict, UnknownExecution
from worker.testing import FakeClock

IDS = ["a", "b", "c", "d"]
TERMINAL = ("completed", "failed")
INPUT, RESPELT_INPUT, OTHER_INPUT = '{"n": 1}', '{ "n" : 1 }', "[1, 2]"
RESPONSES = ["null", "1", '"x"', '{"v": 2}']
# Which of the leases handed out so far a call uses: often a current one or the newest, else any
# (stale ones too).
LEASE_INDEX = st.one_of(st.just("current"), st.just(-1), st.integers(0, 10**6))


def redelivery_delay(n: int) -> int:
    return min(15 * 2 ** (n - 1), 120)


# -- the model ---------------------------------------------------------------------------------


@dataclass
class Delivery:
    token: int
    claimed_at: int
    expires_at: int
    renewals: int = 0
    ended_at: Optional[int] = None
    ended_by: Optional[str] = None
    outcome: Optional[str] = None


@dataclass
class Execution:
    workflow: str
    input_json: str
    created_at: int
    status: str = "admitted"  # as last written; "running" = a delivery that has not ended
    token: int = 0
    due_at: Optional[int] = None
    expires_at: Optional[int] = None
    unacked: int = 0  # unacknowledged deliveries that have ended by release or by a later claim
    last_end: Optional[int] = None  # when the last of those ended
    ever_suspended: bool = False
    wake_during: Optional[int] = None  # earliest wake requested during the open delivery
    result_json: Optional[str] = None
    error_json: Optional[str] = None
    deliveries: list[Delivery] = field(default_factory=list)
    steps: dict[tuple[str, int], tuple[bool, str]] = field(default_factory=dict)  # in write order


def _min(a: Optional[int], b: int) -> int:
    return b if a is None else min(a, b)


def _same_json(a: str, b: str) -> bool:
    return json.loads(a) == json.loads(b)


class LedgerModel:
    def __init__(self, delay):
        self.delay = delay
        self.executions: dict[str, Execution] = {}

    # views as of now

    def live(self, e: Execution, now: int) -> bool:
        return e.status == "running" and e.expires_at > now

    def unacked(self, e: Execution, now: int) -> int:
        # An expired delivery counts like a release, ending at its expiry.
        return e.unacked + (1 if e.status == "running" and not self.live(e, now) else 0)

    def record(self, execution_id: str, now: int) -> Optional[dict]:
        e = self.executions.get(execution_id)
        if e is None:
            return None
        status = e.status
        if status == "running" and not self.live(e, now):
            status = "suspended" if e.ever_suspended else "admitted"
        return dict(
            execution_id=execution_id, workflow=e.workflow, input_json=e.input_json, status=status,
            token=e.token, due_at=e.due_at, lease_expires_at=e.expires_at if status == "running" else None,
            unacknowledged_deliveries=self.unacked(e, now), result_json=e.result_json, error_json=e.error_json,
            created_at=e.created_at,
        )

    def history(self, execution_id: str, now: int) -> list[tuple]:
        rows = []
        for d in self.executions[execution_id].deliveries:
            ended_at, ended_by = d.ended_at, d.ended_by
            if ended_by is None and d.expires_at <= now:
                ended_at, ended_by = d.expires_at, "expired"
            rows.append((d.token, d.claimed_at, d.expires_at, d.renewals, ended_at, ended_by, d.outcome))
        return rows

    def claimable(self, execution_id: str, now: int) -> bool:
        e = self.executions[execution_id]
        if e.status in TERMINAL or e.due_at is None or e.due_at > now or self.live(e, now):
            return False
        n = self.unacked(e, now)
        if n == 0:
            return True
        ended = e.expires_at if e.status == "running" else e.last_end
        return ended + self.delay(n) <= now

    def current(self, lease: ExecutionLease) -> Optional[Execution]:
        e = self.executions.get(lease.execution_id)
        if e is not None and e.status == "running" and lease.token == e.token:
            return e
        return None

    # writes

    def admit(self, execution_id, workflow, input_json, now) -> dict:
        e = self.executions.get(execution_id)
        if e is None:
            self.executions[execution_id] = Execution(workflow, input_json, created_at=now, due_at=now)
        elif e.workflow != workflow or not _same_json(e.input_json, input_json):
            raise ExecutionConflict(execution_id)
        return self.record(execution_id, now)

    def request_wake(self, execution_id, at, now) -> None:
        e = self.executions.get(execution_id)
        if e is None:
            raise UnknownExecution(execution_id)
        if e.status in TERMINAL:
            return
        e.due_at = _min(e.due_at, at)
        if e.status == "running":
            e.wake_during = _min(e.wake_during, at)

    def claim(self, execution_id, now, duration) -> ExecutionLease:
        e = self.executions[execution_id]
        if e.status == "running":  # expired: this claim supersedes it
            e.unacked += 1
            e.last_end = e.expires_at
            d = e.deliveries[-1]
            d.ended_at, d.ended_by = d.expires_at, "superseded"
        e.token += 1
        e.status = "running"
        e.expires_at = now + duration
        e.wake_during = None
        e.deliveries.append(Delivery(e.token, now, e.expires_at))
        return ExecutionLease(execution_id, e.token, e.expires_at)

    def renew(self, lease, duration, now):
        e = self.current(lease)
        if e is None:
            return LeaseLost()
        e.expires_at = now + duration
        d = e.deliveries[-1]
        d.expires_at, d.renewals = e.expires_at, d.renewals + 1
        return Renewed(ExecutionLease(lease.execution_id, e.token, e.expires_at))

    def _end(self, e: Execution, now: int, ended_by: str, outcome: Optional[str]) -> None:
        d = e.deliveries[-1]
        d.ended_at, d.ended_by, d.outcome = now, ended_by, outcome
        e.expires_at = None
        e.wake_during = None

    def release(self, lease, now):
        e = self.current(lease)
        if e is None:
            return LeaseLost()
        e.status = "suspended" if e.ever_suspended else "admitted"
        e.unacked += 1
        e.last_end = now
        self._end(e, now, "released", None)  # the delivery's wakes stay owed in due_at
        return Released()

    def acknowledge(self, lease, outcome, now):
        e = self.current(lease)
        if e is None:
            return LeaseLost()
        e.unacked, e.last_end = 0, None
        if isinstance(outcome, Suspended):
            e.status, e.ever_suspended, e.due_at = "suspended", True, e.wake_during
        elif isinstance(outcome, Completed):
            e.status, e.result_json, e.due_at = "completed", outcome.result_json, None
        else:
            e.status, e.error_json, e.due_at = "failed", outcome.error_json, None
        self._end(e, now, "acknowledged", outcome.status)
        return outcome

    def write_step(self, lease, key, attempt, done, response):
        e = self.current(lease)
        if e is None:
            return LeaseLost()
        if (key, attempt) not in e.steps:
            e.steps[(key, attempt)] = (done, response)
        done, response = e.steps[(key, attempt)]
        return HeapRecord(lease.execution_id, key, attempt, done, response)

    def read_step(self, execution_id, key):
        e = self.executions.get(execution_id)
        attempts = [a for (k, a) in (e.steps if e else {}) if k == key]
        if not attempts:
            return None
        done, response = e.steps[(key, max(attempts))]
        return HeapRecord(execution_id, key, max(attempts), done, response)


# -- the state machine -------------------------------------------------------------------------


def _fields(record: ExecutionRecord) -> dict:
    fields = dict(vars(record))
    del fields["updated_at"]  # SPEC section 3 leaves its exact value open
    # The model's executions are all in the default queue, with no workflow timeout.
    for name, value in (("queue", "default"), ("key", None), ("priority", 0), ("deadline_at", None)):
        assert fields.pop(name) == value
    return fields


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = FakeClock(1_000_000)
        self.backend = self.open()
        self.model = LedgerModel(redelivery_delay)
        self.leases: list[ExecutionLease] = []  # every lease handed out, stale ones included
        self.max_token_seen: dict[str, int] = {}
        self.terminal_seen: dict[str, ExecutionRecord] = {}

    def open(self):
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-model-"))
        return open_backend(self.dir / "ledger.db", clock=self.clock, redelivery_delay=redelivery_delay)

    def teardown(self):
        self.backend.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def now_arg(self, explicit: bool) -> Optional[int]:
        return self.clock.now if explicit else None

    def pick(self, index) -> ExecutionLease:
        if index == "current":
            current = [lease for lease in self.leases if self.model.current(lease) is not None]
            return current[-1] if current else self.leases[-1]
        return self.leases[index % len(self.leases)]

    # rules

    @rule(ms=st.one_of(st.integers(0, 20), st.integers(20, 300)))
    def advance_clock(self, ms):
        self.clock.advance(ms)

    @initialize()
    def admit_the_first_executions(self):
        for execution_id in IDS[:2]:
            self.admit(execution_id, "charge", INPUT, later=0, explicit=False)

    @rule(execution_id=st.sampled_from(IDS), variant=st.integers(0, 9), later=st.sampled_from([0, 0, 0, 40]),
          explicit=st.booleans())
    def admit_execution(self, execution_id, variant, later, explicit):
        # Mostly the execution's own workflow and input (idempotent), sometimes the same input
        # spelt differently, sometimes a conflicting workflow or input.
        workflow = "refund" if variant == 9 else "charge"
        input_json = {7: RESPELT_INPUT, 8: OTHER_INPUT}.get(variant, INPUT)
        self.admit(execution_id, workflow, input_json, later, explicit)

    def admit(self, execution_id, workflow, input_json, later, explicit):
        now = self.clock.now + later
        try:
            expected = self.model.admit(execution_id, workflow, input_json, now)
        except ExecutionConflict:
            with pytest.raises(ExecutionConflict):
                self.backend.executions.admit(execution_id, workflow, input_json, now=now)
            return
        got = self.backend.executions.admit(execution_id, workflow, input_json,
                                            now=now if (later or explicit) else None)
        assert _fields(got) == expected

    @rule(execution_id=st.sampled_from(IDS + ["never-admitted"]), offset=st.integers(-50, 300),
          explicit=st.booleans())
    def request_wake(self, execution_id, offset, explicit):
        self.wake(execution_id, offset, explicit)

    @rule(offset=st.integers(-50, 300))
    def request_wake_for_a_leased_execution(self, offset):
        leased = [i for i, e in self.model.executions.items() if e.status == "running"]
        if leased:
            self.wake(leased[0], offset, explicit=False)

    def wake(self, execution_id, offset, explicit):
        at = self.clock.now + offset
        try:
            self.model.request_wake(execution_id, at, self.clock.now)
        except UnknownExecution:
            with pytest.raises(UnknownExecution):
                self.backend.executions.request_wake(execution_id, at, now=self.now_arg(explicit))
            return
        assert self.backend.executions.request_wake(execution_id, at, now=self.now_arg(explicit)) is None

    @rule(limit=st.integers(0, 3), duration=st.integers(1, 200), explicit=st.booleans())
    def claim_due(self, limit, duration, explicit):
        self.claim(limit, duration, explicit)

    @rule(ms=st.integers(0, 400), limit=st.integers(1, 3), duration=st.integers(1, 200))
    def let_time_pass_and_claim_due(self, ms, limit, duration):
        self.clock.advance(ms)
        self.claim(limit, duration, explicit=False)

    def claim(self, limit, duration, explicit):
        now = self.clock.now
        claimable = [i for i in self.model.executions if self.model.claimable(i, now)]
        leases = self.backend.executions.claim_due(limit=limit, duration=duration, now=self.now_arg(explicit))

        claimed = [lease.execution_id for lease in leases]
        assert len(claimed) == len(set(claimed))
        assert set(claimed) <= set(claimable), (claimed, claimable)
        assert len(claimed) == min(limit, len(claimable))
        dues = [self.model.executions[i].due_at for i in claimed]
        assert dues == sorted(dues), "earliest due_at first"
        passed_over = [self.model.executions[i].due_at for i in claimable if i not in claimed]
        if dues and passed_over:
            assert max(dues) <= min(passed_over)
        for lease in leases:
            assert lease == self.model.claim(lease.execution_id, now, duration)
            self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(index=LEASE_INDEX, duration=st.integers(1, 200), explicit=st.booleans())
    def renew(self, index, duration, explicit):
        lease = self.pick(index)
        expected = self.model.renew(lease, duration, self.clock.now)
        got = self.backend.executions.renew(lease, duration=duration, now=self.now_arg(explicit))
        assert got == expected
        if isinstance(got, Renewed):
            self.leases.append(got.lease)

    @precondition(lambda self: self.leases)
    @rule(indices=st.lists(LEASE_INDEX, max_size=4), duration=st.integers(1, 200), explicit=st.booleans())
    def renew_many(self, indices, duration, explicit):
        leases = [self.pick(index) for index in indices]
        expected, by_lease = [], {}  # a lease given twice in one batch is renewed once
        for lease in leases:
            key = (lease.execution_id, lease.token)
            if key not in by_lease:
                by_lease[key] = self.model.renew(lease, duration, self.clock.now)
            expected.append(by_lease[key])
        got = self.backend.executions.renew_many(leases, duration=duration, now=self.now_arg(explicit))
        assert got == expected
        self.leases += [reply.lease for reply in got if isinstance(reply, Renewed)]

    @precondition(lambda self: self.leases)
    @rule(index=LEASE_INDEX, explicit=st.booleans())
    def release(self, index, explicit):
        lease = self.pick(index)
        expected = self.model.release(lease, self.clock.now)
        assert self.backend.executions.release(lease, now=self.now_arg(explicit)) == expected

    @precondition(lambda self: self.leases)
    @rule(index=LEASE_INDEX,
          outcome=st.sampled_from([Suspended(), Suspended(), Completed('{"paid": true}'), Failed('"declined"')]),
          explicit=st.booleans())
    def acknowledge(self, index, outcome, explicit):
        lease = self.pick(index)
        expected = self.model.acknowledge(lease, outcome, self.clock.now)
        got = self.backend.executions.acknowledge(lease, outcome, now=self.now_arg(explicit))
        assert got == expected
        assert got.status in ("suspended", "completed", "failed", "lost")

    @precondition(lambda self: self.leases)
    @rule(index=LEASE_INDEX, key=st.sampled_from(["load", "charge"]), attempt=st.integers(0, 2),
          done=st.booleans(), response=st.sampled_from(RESPONSES))
    def write_step(self, index, key, attempt, done, response):
        lease = self.pick(index)
        expected = self.model.write_step(lease, key, attempt, done, response)
        got = self.backend.heap.write_step(lease, step_key=key, step_attempt=attempt, done=done,
                                           step_response_json=response)
        assert got == expected

    @precondition(lambda self: self.leases)
    @rule(items=st.lists(st.tuples(LEASE_INDEX, st.sampled_from(["load", "charge"]), st.integers(0, 2),
                                   st.booleans(), st.sampled_from(RESPONSES)), max_size=4))
    def write_steps(self, items):
        writes, keys = [], set()
        for index, key, attempt, done, response in items:
            lease = self.pick(index)
            if (lease.execution_id, key, attempt) not in keys:  # which of two writes of one attempt wins is open
                keys.add((lease.execution_id, key, attempt))
                writes.append(StepWrite(lease, key, attempt, done, response))
        expected = [self.model.write_step(w.lease, w.step_key, w.step_attempt, w.done, w.step_response_json)
                    for w in writes]
        assert self.backend.heap.write_steps(writes) == expected

    @rule(execution_id=st.sampled_from(IDS), key=st.sampled_from(["load", "charge"]))
    def read_step(self, execution_id, key):
        assert self.backend.heap.read_step(execution_id, key) == self.model.read_step(execution_id, key)

    # invariants

    @invariant()
    def backend_agrees_with_the_model_and_the_invariants_hold(self):
        now = self.clock.now
        for execution_id in IDS:
            record = self.backend.executions.get(execution_id)
            expected = self.model.record(execution_id, now)
            if expected is None:
                assert record is None
                continue
            assert _fields(record) == expected

            history = self.backend.executions.history(execution_id)
            # 2. Tokens strictly increase with each claim: one delivery per token, 1, 2, 3, ...
            assert [h.token for h in history] == list(range(1, record.token + 1))
            assert record.token >= self.max_token_seen.get(execution_id, 0)
            self.max_token_seen[execution_id] = record.token
            # 1. At most one live lease, and it is the current token's.
            live = [h for h in history if h.ended_by is None]
            assert len(live) <= 1
            assert all(h.expires_at > now for h in live)
            if record.status == "running":
                assert [(h.token, h.expires_at) for h in live] == [(record.token, record.lease_expires_at)]
                assert record.lease_expires_at > now
            else:
                assert live == [] and record.lease_expires_at is None
            # Every earlier delivery has ended before the next one was claimed.
            for before, after in zip(history, history[1:]):
                assert before.ended_at is not None and before.ended_at <= after.claimed_at
            assert [(h.token, h.claimed_at, h.expires_at, h.renewals, h.ended_at, h.ended_by, h.outcome)
                    for h in history] == self.model.history(execution_id, now)
            # 3 and 5. Outcomes, statuses and step records are never overwritten.
            if execution_id in self.terminal_seen:
                assert record == self.terminal_seen[execution_id]
            elif record.status in TERMINAL:
                self.terminal_seen[execution_id] = record
                assert (record.result_json is None) == (record.status == "failed")
                assert record.due_at is None
            model_steps = self.model.executions[execution_id].steps
            assert self.backend.heap.steps(execution_id) == [
                HeapRecord(execution_id, key, attempt, done, response)
                for (key, attempt), (done, response) in model_steps.items()
            ]
            assert record.unacknowledged_deliveries >= 0


LedgerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_ledger_matches_the_model = pytest.mark.timeout(300)(LedgerMachine.TestCase)


class PostgresLedgerMachine(LedgerMachine):
    """The same machine on a PostgreSQL database, emptied after each example."""

    uri = ""

    def open(self):
        return open_backend(self.uri, clock=self.clock, redelivery_delay=redelivery_delay)

    def teardown(self):
        self.backend.connection.execute(
            "TRUNCATE executions, lease_history, steps, waiters, starts, effects, stores, store_receipts")
        self.backend.close()


@pytest.mark.timeout(600)
def test_the_postgresql_ledger_matches_the_model(pg_uri):
    PostgresLedgerMachine.uri = pg_uri
    run_state_machine_as_test(PostgresLedgerMachine, settings=settings(
        max_examples=100, stateful_step_count=40, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
