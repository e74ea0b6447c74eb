"""A ledger summary in the Prometheus text exposition format (version 0.0.4).

`yieldstar metrics > DIR/yieldstar.prom.tmp && mv DIR/yieldstar.prom.tmp DIR/yieldstar.prom`
lets a node exporter's textfile collector publish it (the rename makes each file whole):
nothing here listens on a port (`supervise --metrics` serves the same families, read on each
scrape, beside its own histograms: `metrics_server`). Every figure comes from one `LedgerStats`
reading, so the samples agree with each other.
"""

from __future__ import annotations

from .ledger.values import LedgerStats


def exposition(stats: LedgerStats, *, unacknowledged: int) -> str:
    """The metrics text: `# HELP` and `# TYPE` before each family, one sample a line.

    Args:
        stats: one reading of `executions.stats()`.
        unacknowledged: how many executions have unacknowledged deliveries (the caller reads
            `stats` with a limit large enough to count them all).
    """
    lines = []
    for name, kind, help_text, samples in families(stats, unacknowledged=unacknowledged):
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(labels)} {value}")
    return "\n".join(lines) + "\n"


def families(stats: LedgerStats, *, unacknowledged: int) -> list[tuple[str, str, str, list[tuple[dict, object]]]]:
    """The families of `exposition` as (name, type, help, [(labels, value)]), values as printed
    (an int, or seconds as text): also what `supervise --metrics` serves as its `stats` gauges
    (`metrics_server.LedgerGauges`)."""
    return [
        ("yieldstar_executions", "gauge", "Executions by status (as of now) and workflow; zero counts are left out.",
         [({"status": status, "workflow": workflow}, count)
          for workflow, counts in sorted(stats.by_workflow.items())
          for status, count in sorted(counts.items())]),
        ("yieldstar_executions_by_status", "gauge", "Executions by status (as of now), zeros included.",
         [({"status": status}, count) for status, count in stats.by_status.items()]),
        ("yieldstar_live_leases", "gauge", "Deliveries in progress: leases that have not expired.",
         [({}, len(stats.live_leases))]),
        ("yieldstar_deliveries_total", "counter", "Claims ever made (rows of the lease history); purge lowers it.",
         [({}, stats.deliveries)]),
        ("yieldstar_unacknowledged_executions", "gauge",
         "Executions whose last deliveries ended without an outcome (crashed, frozen or released).",
         [({}, unacknowledged)]),
        ("yieldstar_unacknowledged_deliveries_max", "gauge",
         "The most unacknowledged deliveries in a row of any one execution.",
         [({}, max((r.unacknowledged_deliveries for r in stats.unacknowledged), default=0))]),
        ("yieldstar_parked_executions", "gauge",
         "Executions parked after a diverged replay (suspended, waiting for new code), by workflow.",
         [({"workflow": workflow}, count) for workflow, count in sorted(stats.parked.items())]),
        ("yieldstar_oldest_due_seconds", "gauge",
         "How long the longest-waiting due execution (whatever its priority, held back by its queue or not) has"
         " been due; 0 when none is.",
         [({}, _seconds(stats.now - stats.oldest_due.due_at) if stats.oldest_due is not None else 0)]),
        ("yieldstar_queue_executions", "gauge",
         "Executions of each queue by state: due (claimable, or held back by the queue's limits), running (live"
         " leases) and waiting (neither terminal nor due).",
         [({"queue": queue.name, "state": state}, getattr(queue, state))
          for queue in stats.queues for state in ("due", "running", "waiting")]),
        ("yieldstar_queue_limit", "gauge",
         "Each queue's limits: concurrency and per_key (live leases), rate_count claims per rate_seconds;"
         " a limit the queue does not have is left out.",
         [({"queue": queue.name, "limit": name}, value) for queue in stats.queues
          for name, value in _limits(queue) if value is not None]),
    ]


def _limits(queue) -> list[tuple[str, object]]:
    rate_count, rate_seconds = queue.rate if queue.rate is not None else (None, None)
    return [("concurrency", queue.concurrency), ("per_key", queue.per_key), ("rate_count", rate_count),
            ("rate_seconds", rate_seconds)]


def _seconds(ms: int) -> str:
    return f"{max(ms, 0) / 1000:.3f}"


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape_label(str(value))}"' for key, value in labels.items()) + "}"


def _escape_label(value: str) -> str:
    # The format's three escapes in label values: backslash, double quote, line feed.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
