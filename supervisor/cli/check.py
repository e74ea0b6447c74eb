"""`yieldstar check APP`: would APP's code replay the work in flight, or diverge (SPEC section 11)?

Before a rollout: every non-terminal execution of the workflows APP registers is replayed
against APP's code in this process (`worker._runtime.check.replay_check`), running no step
function, timer or effect and writing nothing, up to its first step not yet recorded. The
executions that would diverge are listed with the detail a delivery would park them with; the
non-terminal executions of workflows APP does not register are listed apart (no supervisor of
APP would take them). Exit 0 when none would diverge, 1 when any would, 2 on bad input (an APP
that does not load, a ledger that does not exist).

APP's module is imported here, as a worker imports it, and its workflow code runs up to where
the check stops: what it prints goes to stderr, so that `--json` stays one JSON object.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter

import click

from ..ledger.values import ExecutionStatus
from . import EXIT_UNKNOWN, backend_of, handles_errors, main, params

WAITING = (ExecutionStatus.ADMITTED, ExecutionStatus.RUNNING, ExecutionStatus.SUSPENDED)


@main.command()
@click.argument("app", callback=params.not_empty)
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON object.")
@click.pass_context
@handles_errors
def check(ctx, app: str, as_json_: bool) -> None:
    """Replay every non-terminal execution of APP's workflows against APP's code, writing nothing,
    and list those that would diverge (exit 1 if any) and the work APP does not serve."""
    from worker._runtime.check import replay_check
    from worker._runtime.loading import load_app

    began = time.monotonic()
    with backend_of(ctx, create=False) as backend:
        with contextlib.redirect_stdout(sys.stderr):
            registry = load_app(app)
        served = set(registry.names())
        now = backend.clock()
        waiting: dict[str, object] = {}
        for status in WAITING:
            for record in backend.executions.list(status=status.value, now=now):
                waiting.setdefault(record.execution_id, record)
        diverged, unserved, checked = [], [], 0
        with contextlib.redirect_stdout(sys.stderr):
            for execution_id, record in sorted(waiting.items()):
                if record.workflow not in served:
                    unserved.append(record)
                    continue
                found = backend.executions.get_with_steps(execution_id, now=now)
                if found is None:
                    continue  # purged since the list
                detail = replay_check(backend, *found, registry)
                checked += 1
                if detail is not None:
                    diverged.append((record, detail))
    seconds = time.monotonic() - began
    if as_json_:
        click.echo(json.dumps({
            "app": app, "workflows": sorted(served), "checked": checked, "seconds": round(seconds, 3),
            "diverge": [{"execution_id": r.execution_id, "workflow": r.workflow, "status": str(r.status),
                         "detail": detail} for r, detail in diverged],
            "not_served": [{"execution_id": r.execution_id, "workflow": r.workflow, "status": str(r.status)}
                           for r in unserved],
        }))
    else:
        click.echo("\n".join(_lines(app, served, checked, seconds, diverged, unserved)))
    if diverged:
        sys.exit(EXIT_UNKNOWN)


def _lines(app: str, served: set, checked: int, seconds: float, diverged: list, unserved: list) -> list[str]:
    names = ", ".join(sorted(served)) or "none"
    lines = [f"checked {checked} non-terminal executions of {app}'s workflows ({names}) in {seconds:.2f} s"]
    if diverged:
        lines.append(f"would diverge: {len(diverged)} (a supervisor of {app} would park them, running nothing)")
        width = max(len(r.execution_id) for r, _ in diverged)
        for record, detail in diverged:
            lines.append(f"  {record.execution_id:<{width}}  {record.workflow}: {detail}")
    else:
        lines.append("would diverge: none")
    if unserved:
        counts = Counter(r.workflow for r in unserved)
        by_workflow = ", ".join(f"{workflow} {count}" for workflow, count in sorted(counts.items()))
        lines.append(f"not served by {app}: {len(unserved)} executions ({by_workflow})")
    return lines
