"""Two holders of one execution, interleaved in one process: the fencing tests of starts,
effects and stores (`test_starts.py`, `test_effects.py`, `test_stores.py`).

A *holder* is a delivery's view of the ledger: a backend of its own (its own connection, as if
it ran in its own process) and the lease it claimed. Every holder shares one `FakeClock`, so a
test lets a lease run out by moving the clock, never by sleeping.

A stale holder is frozen at a chosen point with `Interposed`: just before one of its ledger
calls (a store change, a start, a settle), a `before` callback runs what happens while it is
frozen (its lease runs out, another holder claims with a higher token and does its work), and
then the call goes ahead, late, exactly as a thawed process would make it. Deterministic: no
threads, no sleeps, no mocks; every call reaches the real ledger, on each backend in turn.

Fixtures (registered for the whole suite by tests/conftest.py): `world`, one ledger on each
backend in turn, and `holder`, the test's own backend on it (the current holder's, and the
outside world's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from faults import query
from supervisor import Completed, ExecutionLease, Failed, Retry, Suspended, open_backend
from worker._runtime.driver import run_delivery
from worker.testing import FakeClock

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
NEIGHBOURS_APP = TESTS / "apps" / "neighbours_app.py"

LEASE_MS = 5_000


class World:
    """One ledger file, one clock (a `FakeClock` unless told otherwise), and as many holders'
    backends as a test opens."""

    def __init__(self, path: Path, clock: Optional[Callable[[], int]] = None):
        self.path = path
        self.clock = clock or FakeClock()
        self._opened: list = []

    def holder(self):
        """A new backend on the ledger, as a separate process would open it. A 1 ms redelivery
        delay, so that an execution whose lease ran out can be claimed right after."""
        backend = open_backend(self.path, clock=self.clock, redelivery_delay=lambda n: 1)
        self._opened.append(backend)
        return backend

    def claim(self, backend, execution_id: Optional[str] = None) -> ExecutionLease:
        """Claim the one execution due first, which must be `execution_id` if given.

        A claim takes a millisecond of fake time, so that whatever the delivery starts or wakes
        is due after the execution itself: the ledger leaves the order of equal due times open.
        """
        leases = backend.executions.claim_due(limit=1, duration=LEASE_MS)
        assert len(leases) == 1 and execution_id in (None, leases[0].execution_id), leases
        if isinstance(self.clock, FakeClock):
            self.clock.advance(1)
        return leases[0]

    def take_over(self, backend, stale: ExecutionLease) -> ExecutionLease:
        """Let `stale` run out (nobody renews it) and claim its execution again with `backend`."""
        self.clock.now = max(self.clock.now, stale.expires_at + 1)
        lease = self.claim(backend, stale.execution_id)
        assert lease.token == stale.token + 1
        return lease

    def deliver(self, backend, lease: ExecutionLease, registry):
        """Run one delivery and end it as a supervisor would; returns the delivery's outcome."""
        outcome = run_delivery(backend, lease, registry)
        if isinstance(outcome, (Suspended, Completed, Failed)):
            assert backend.executions.acknowledge(lease, outcome) == outcome
        elif isinstance(outcome, Retry):  # pragma: no cover - nothing holds the database here
            backend.executions.release(lease)
        return outcome

    def claim_and_deliver(self, backend, execution_id: Optional[str], registry):
        return self.deliver(backend, self.claim(backend, execution_id), registry)

    def close(self) -> None:
        for backend in self._opened:
            backend.close()


class Interposed:
    """`backend` as one holder sees it, with `before()` run just before its first call of
    `where` ("stores.change", "starts.start", "effects.settle", ...) whose arguments satisfy
    `when` (default: any): the holder is frozen right there while `before` plays out. Every
    reply to `where` is kept in `replies`.

    Everything else is the real backend; pass an `Interposed` to `run_delivery` in its place.
    """

    def __init__(self, backend, where: str, before: Optional[Callable[[], Any]] = None,
                 when: Callable[..., bool] = lambda *args, **kwargs: True):
        self._backend = backend
        self._client, self._method = where.split(".")
        self._before = before
        self._when = when
        self.replies: list = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        return _InterposedClient(self, value) if name == self._client else value

    def _call(self, method: Callable, *args, **kwargs) -> Any:
        if self._before is not None and self._when(*args, **kwargs):
            before, self._before = self._before, None
            before()
        reply = method(*args, **kwargs)
        self.replies.append(reply)
        return reply


class _InterposedClient:
    def __init__(self, owner: Interposed, client):
        self._owner = owner
        self._client = client

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if name != self._owner._method:
            return value
        return lambda *args, **kwargs: self._owner._call(value, *args, **kwargs)


def deliveries(backend, execution_id: str) -> int:
    """How many times the execution was claimed."""
    return len(backend.executions.history(execution_id))


def step_rows(path, execution_id: str) -> list[tuple[str, int, Any, int]]:
    """`(step_key, attempt, response, token)` of each recorded step, in the order written, as an
    independent reader sees them: the token is the one the write was accepted under."""
    return [(key, attempt, json.loads(response), token) for key, attempt, response, token in table(
        path, "SELECT step_key, attempt, step_response_json, token FROM steps WHERE execution_id = $p ORDER BY $row_order",
        execution_id)]


def table(path, sql: str, *params) -> list[tuple]:
    """Rows of a read-only query on the ledger, for tables the API does not list (starts, waiters)."""
    return [tuple(row) for row in query(path, sql, *params)]


def result_of(record) -> Any:
    assert record.status == "completed", (record.status, record.error_json)
    return json.loads(record.result_json)


def cli_command(db, *args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor.cli", "--db", str(db), *args]


# Fixtures (registered by tests/conftest.py).

@pytest.fixture
def world(each_backend):
    """One ledger for several holders, each with a backend of its own: a SQLite file, or a
    database on a PostgreSQL server."""
    opened = World(each_backend)
    yield opened
    opened.close()


@pytest.fixture
def holder(world):
    """The test's own backend: the current holder's, and the outside world's."""
    return world.holder()
