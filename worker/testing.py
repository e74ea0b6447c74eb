"""Run workflows in-process, with a fake clock, for workflow authors' unit tests.

    from worker.testing import run_workflow

    record = run_workflow(registry, "order", {"order_id": 42})
    assert record.status == "completed"

Timers and retry backoffs do not wait: whenever nothing is claimable, the fake clock jumps to
the execution's next due time. A delivery that meets a storage error is released and delivered
again, as a supervisor would; one that finds the ledger unusable (corrupt, say) raises
`WorkflowStuck` naming the error instead of trying again, and so does a replay that diverged
from the execution's recorded steps (SPEC section 11), with the divergence's detail.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

from supervisor import Completed, Failed, LeaseLost, Retry, Suspended, open_backend
from supervisor.ledger.errors import TRANSIENT_KINDS, WorkflowStuck
from supervisor.ledger.values import TERMINAL_STATUSES, ExecutionRecord

from ._runtime.driver import run_delivery
from ._runtime.tracing import current_context
from .registry import Registry


class FakeClock:
    """A clock in integer ms that moves only when told to."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def run_workflow(registry: Registry, workflow: str, input: Any = None, *, execution_id: str = "test-execution",
                 backend: Any = None, clock: Optional[FakeClock] = None, max_deliveries: int = 1000,
                 lease_ms: int = 30_000) -> ExecutionRecord:
    """Admit `workflow` with `input` and deliver it until it is terminal; return its record.

    With no `backend`, a temporary SQLite file is used and removed afterwards. Deliveries that
    reply `Retry` are released and tried again; a `Retry` for an unusable ledger raises
    `WorkflowStuck` with the storage error's kind and message.
    """
    if backend is None:
        clock = clock or FakeClock()
        with tempfile.TemporaryDirectory(prefix="yieldstar-test-") as folder:
            with open_backend(os.path.join(folder, "ledger.db"), clock=clock, redelivery_delay=lambda n: 1) as backend:
                return run_workflow(registry, workflow, input, execution_id=execution_id, backend=backend,
                                    clock=clock, max_deliveries=max_deliveries, lease_ms=lease_ms)
    if workflow not in registry:
        # A supervisor would never claim it (routing, SPEC section 11): it would stay admitted.
        known = ", ".join(registry.names()) or "none"
        raise WorkflowStuck(f"no workflow is registered as {workflow!r} (registered: {known}): no supervisor"
                            " of this registry would ever run it")
    # Called inside an OpenTelemetry span, the deliveries' spans are its children, as a start's are.
    backend.executions.admit(execution_id, workflow, json.dumps(input), trace_context=current_context())
    retried = ""
    for _ in range(max_deliveries):
        record = backend.executions.get(execution_id)
        if record.status in TERMINAL_STATUSES:
            return record
        claims = backend.executions.claim_deliveries(limit=1, duration=lease_ms)
        if not claims:
            ready = backend.executions.next_ready_at()
            if ready is None:
                raise WorkflowStuck(f"execution {execution_id!r} is {record.status} and waits for nothing that is due")
            if clock is None:
                raise WorkflowStuck(f"execution {execution_id!r} is due at {ready}; pass a FakeClock to jump")
            clock.now = max(clock.now + 1, ready)
            continue
        lease = claims[0].lease
        outcome = run_delivery(backend, lease, registry, claimed_at=lease.expires_at - lease_ms,
                               trace_context=claims[0].trace_context)
        if isinstance(outcome, (Suspended, Completed, Failed)):
            backend.executions.acknowledge(lease, outcome)
            if isinstance(outcome, Suspended) and outcome.diverged is not None:
                raise WorkflowStuck(f"execution {execution_id!r} diverged from its recorded steps and is parked:"
                                    f" {outcome.diverged}")
        elif isinstance(outcome, Retry):
            if outcome.storage_error not in (None, *TRANSIENT_KINDS):
                raise WorkflowStuck(f"execution {execution_id!r} cannot go on: the ledger is unusable"
                                    f" ({outcome.storage_error}): {outcome.reason}")
            retried = f" (the last delivery asked to be retried: {outcome.reason})"
            backend.executions.release(lease)
        elif isinstance(outcome, LeaseLost):  # pragma: no cover - nobody else holds leases here
            raise WorkflowStuck(f"execution {execution_id!r} lost its lease in an in-process run")
    raise WorkflowStuck(f"execution {execution_id!r} was not terminal after {max_deliveries} deliveries{retried}")
