"""Commands that summarise a ledger: `stats`, `metrics`, and the live view `top`.

All three read one `executions.stats()` (a single read transaction), then the workflows live
supervisors serve (`supervisors.served()`), and never write. Work that no live supervisor serves
(routing, SPEC section 11) is shown apart: `stats --json`'s `unserved`, a `not served` line, and
a line in `top`.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from ..humane import format_duration, format_time, queue_cells
from ..ledger.values import LedgerStats
from ..metrics import exposition
from . import as_json, backend_of, handles_errors, main, params
from .queues import queue_json

# `metrics` counts every execution with unacknowledged deliveries, so it reads them all.
ALL = 2 ** 62


@main.command()
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="List at most this many executions with unacknowledged deliveries.")
@click.option("--json", "as_json_", is_flag=True, help="Print one JSON object.")
@click.pass_context
@handles_errors
def stats(ctx, limit: int, as_json_: bool) -> None:
    """Counts per status and workflow, the oldest due execution, and those whose deliveries fail."""
    with backend_of(ctx, create=False) as backend:
        summary = read_stats(backend, limit=limit)
    if as_json_:
        click.echo(json.dumps(stats_json(summary)))
        return
    click.echo("\n".join(stats_lines(summary)))


def read_stats(backend, **options) -> LedgerStats:
    """`executions.stats(**options)`, with the workflows live supervisors serve."""
    summary = backend.executions.stats(**options)
    return summary.with_served(backend.supervisors.served(now=summary.now))


def stats_json(summary: LedgerStats) -> dict:
    """The summary as JSON: times in epoch ms, executions as in `ls --json`."""
    oldest = summary.oldest_due
    return {
        "now": summary.now,
        "by_status": summary.by_status,
        "by_workflow": summary.by_workflow,
        "oldest_due": None if oldest is None else {**as_json(oldest), "waited_ms": max(summary.now - oldest.due_at, 0)},
        "unacknowledged": [as_json(r) for r in summary.unacknowledged],
        "live_leases": [asdict(lease) for lease in summary.live_leases],
        "deliveries": summary.deliveries,
        "parked": summary.parked,
        "unserved": summary.unserved(),
        "queues": [queue_json(queue) for queue in summary.queues],
    }


def stats_lines(summary: LedgerStats) -> list[str]:
    now = summary.now
    width = max([len("unacknowledged")] + [len(s) + 2 for s in summary.by_status]
                + [len(w) + 2 for w in summary.by_workflow])
    lines = [f"{'executions':<{width}}  {sum(summary.by_status.values())}"]
    lines += [f"{'  ' + status:<{width}}  {count}" for status, count in summary.by_status.items()]
    lines.append("by workflow" if summary.by_workflow else f"{'by workflow':<{width}}  none")
    lines += [f"{'  ' + workflow:<{width}}  " + ", ".join(f"{status} {count}" for status, count in counts.items())
              for workflow, counts in summary.by_workflow.items()]
    oldest = summary.oldest_due
    if oldest is None:
        lines.append(f"{'oldest due':<{width}}  none")
    else:
        lines.append(f"{'oldest due':<{width}}  {oldest.execution_id} ({oldest.workflow}), waiting"
                     f" {format_duration(max(now - oldest.due_at, 0))} (due since {format_time(oldest.due_at)})")
    if not summary.unacknowledged:
        lines.append(f"{'unacknowledged':<{width}}  none")
    for i, record in enumerate(summary.unacknowledged):
        noun = "delivery" if record.unacknowledged_deliveries == 1 else "deliveries"
        lines.append(f"{'unacknowledged' if i == 0 else '':<{width}}  {record.execution_id} ({record.workflow},"
                     f" {record.status}): {record.unacknowledged_deliveries} {noun} in a row")
    if summary.parked:
        lines.append(f"{'parked':<{width}}  {sum(summary.parked.values())} waiting for new code ("
                     + ", ".join(f"{workflow} {count}" for workflow, count in summary.parked.items())
                     + "): a supervisor that serves the workflow tries them when it starts; `resume ID` one")
    lines += queue_lines(summary, width)
    lines.append(f"{'live leases':<{width}}  {len(summary.live_leases)}")
    lines.append(f"{'deliveries':<{width}}  {summary.deliveries}")
    lines += unserved_lines(summary, width)
    return lines


def queue_lines(summary: LedgerStats, width: int) -> list[str]:
    """`by queue`, then a line per queue: its limits, then its due, running and waiting counts."""
    lines = ["by queue"]
    for queue in summary.queues:
        _, concurrency, per_key, rate, due, running, waiting = queue_cells(queue)
        limits = ", ".join(f"{label} {value}" for label, value in (("concurrency", concurrency),
                                                                  ("per key", per_key), ("rate", rate)) if value != "-")
        lines.append(f"{'  ' + queue.name:<{width}}  due {due}, running {running}, waiting {waiting}"
                     + (f" (limits: {limits})" if limits else ""))
    return lines


def unserved_lines(summary: LedgerStats, width: int) -> list[str]:
    """`not served` and a line per workflow that no live supervisor serves while executions of it
    wait; nothing when every waiting workflow is served."""
    unserved = summary.unserved()
    if not unserved:
        return []
    return [f"{'not served':<{width}}  no live supervisor serves these workflows; their executions wait"] + [
        f"{'  ' + workflow:<{width}}  " + ", ".join(f"{status} {count}" for status, count in counts.items())
        for workflow, counts in unserved.items()]


@main.command()
@click.pass_context
@handles_errors
def metrics(ctx) -> None:
    """Print the counts in the Prometheus text format, for a node exporter's textfile collector."""
    with backend_of(ctx, create=False) as backend:
        summary = backend.executions.stats(limit=ALL)
    click.echo(exposition(summary, unacknowledged=len(summary.unacknowledged)), nl=False)


@main.command()
@click.option("--interval", type=params.Seconds(0.1, 3600), default=1.0, show_default=True, metavar="S",
              help="Seconds between refreshes (0.1 to 3600).")
@click.pass_context
@handles_errors
def top(ctx, interval: float) -> None:
    """A live view: counts per status, deliveries per second, live leases, failing executions.

    Quits on q or Ctrl-C. When stdout is not a terminal, prints one snapshot and exits."""
    from ..top import run  # rich is imported only by the command that draws with it

    with backend_of(ctx, create=False) as backend:
        run(lambda: read_stats(backend), interval=interval, title=ctx.obj["db"])
