"""The claim against a simple model of SPEC section 12, on each backend: under random admissions
(queues with a concurrency limit, a per_key limit, both, or none; keys; priorities), claims of
one, acknowledgements and time passing (leases expire), every claim takes exactly the execution
the model names: the first by priority, then due time, whose queue and key still have room,
counting live leases only. The claim reads a queue group by group, or key by key when it holds
saturated keys, and passes over a queue it sees saturated: the model reads every row.

Each example works in workflows and queues of its own (named by the example's number), and its
claims name that workflow, so that one ledger serves every example.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from supervisor import Completed, open_backend
from supervisor.ledger.tables import queues

LEASE_MS = 1_000
REDELIVERY_MS = 1  # after a lease expired, before its execution may be claimed again
LIMITS = {"one": {"concurrency": 1}, "keyed": {"per_key": 1}, "both": {"concurrency": 2, "per_key": 1},
          "free": {}}
# Enough keys, for the queue "many", that the claim steps over saturated keys in its group's order
# (`queues.KEYS_AT_MOST`) instead of reading key by key.
MANY_KEYS = [f"k{i:02}" for i in range(queues.KEYS_AT_MOST + 1)]


@dataclass
class Execution:
    seq: int
    queue: str
    key: Optional[str]
    priority: int
    due_at: int
    expires: Optional[int] = None  # while claimed: its lease's expiry
    done: bool = False


def expected_claim(executions: dict[str, Execution], now: int) -> Optional[str]:
    """The execution a claim of one takes at `now`, by the rules of SPEC section 12."""
    live: dict[str, int] = {}
    live_by_key: dict[tuple[str, str], int] = {}
    for each in executions.values():
        if not each.done and each.expires is not None and each.expires > now:
            live[each.queue] = live.get(each.queue, 0) + 1
            if each.key is not None:
                live_by_key[each.queue, each.key] = live_by_key.get((each.queue, each.key), 0) + 1
    candidates = [(-each.priority, each.due_at, each.expires is not None, each.seq, execution_id)
                  for execution_id, each in executions.items()
                  if not each.done and (each.expires is None or each.expires + REDELIVERY_MS <= now)]
    for *_, execution_id in sorted(candidates):
        each = executions[execution_id]
        limits = LIMITS.get(each.queue.split("-")[0], {"per_key": 1})
        if live.get(each.queue, 0) >= limits.get("concurrency", float("inf")):
            continue
        if each.key is not None and live_by_key.get((each.queue, each.key), 0) >= limits.get("per_key", float("inf")):
            continue
        return execution_id
    return None


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(sorted(LIMITS) + ["many"]), st.sampled_from([None, "a", "b"]),
              st.integers(0, 2), st.integers(0, len(MANY_KEYS) - 1)),
    st.tuples(st.just("claim")),
    st.tuples(st.just("acknowledge"), st.integers(0, 30)),
    st.tuples(st.just("wait"), st.integers(1, 2 * LEASE_MS)),
), min_size=1, max_size=40)


@pytest.fixture
def model_ledger(each_backend):
    with open_backend(each_backend, redelivery_delay=lambda n: REDELIVERY_MS) as opened:
        yield opened


@pytest.mark.timeout(600)
@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(operations=OPERATIONS)
# A held key, with rows of that key (ahead), of no key and of another key behind it; in a queue of
# few keys (read key by key) and of many (stepped over in order).
@example(operations=[("admit", "keyed", "a", 0, 0), ("claim",), ("admit", "keyed", "a", 2, 0),
                     ("admit", "keyed", None, 0, 0), ("admit", "keyed", "b", 1, 0), ("claim",), ("claim",),
                     ("claim",), ("wait", LEASE_MS + REDELIVERY_MS), ("claim",)])
@example(operations=[("admit", "many", "a", 0, i) for i in range(len(MANY_KEYS))] + [("claim",)] * 3
         + [("admit", "many", "a", 2, 0), ("admit", "many", None, 1, 0), ("claim",), ("claim",)])
def test_every_claim_takes_what_the_model_names_and_no_limit_is_exceeded(model_ledger, operations):
    example = next(EXAMPLES)
    workflow = f"wf{example}"
    for name, limits in LIMITS.items():
        if limits:
            model_ledger.queues.declare(f"{name}-{example}", **limits)
    model_ledger.queues.declare(f"many-{example}", per_key=1)
    executions: dict[str, Execution] = {}
    leases = {}
    now = 1_000_000 + example * 10_000_000
    for operation in operations:
        if operation[0] == "admit":
            _, queue, key, priority, many = operation
            key = MANY_KEYS[many] if queue == "many" and key is not None else key
            execution_id = f"{workflow}-{len(executions)}"
            model_ledger.executions.admit(execution_id, workflow, queue=f"{queue}-{example}", key=key,
                                          priority=priority, now=now)
            executions[execution_id] = Execution(len(executions), f"{queue}-{example}", key, priority, now)
        elif operation[0] == "claim":
            expected = expected_claim(executions, now)
            got = model_ledger.executions.claim_due(limit=1, duration=LEASE_MS, now=now, workflows={workflow})
            assert [lease.execution_id for lease in got] == ([] if expected is None else [expected])
            for lease in got:
                executions[lease.execution_id].expires = lease.expires_at
                leases[lease.execution_id] = lease
        elif operation[0] == "acknowledge":
            live = sorted(eid for eid, each in executions.items()
                          if not each.done and each.expires is not None and each.expires > now)
            if live:
                execution_id = live[operation[1] % len(live)]
                assert model_ledger.executions.acknowledge(leases[execution_id], Completed("null"), now=now) \
                    == Completed("null")
                executions[execution_id].done = True
        else:
            now += operation[1]


EXAMPLES = itertools.count()
