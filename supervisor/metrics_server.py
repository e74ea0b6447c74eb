"""`supervise --metrics ADDR`: the supervisor's Prometheus endpoint (SPEC section 13).

    dispatcher loop (main thread)                   HTTP thread (prometheus_client's server)
    claimed, steps_ran, ended, storage_error        GET /metrics
      |  observe (each metric has its own lock)       |  collects this registry:
      v                                               v
    histograms and counters  ---------------------> delivery, step and claim-delay histograms,
                                                    outcome, lost-lease and storage-error counters
    ledger (own connection, opened on the first     the `stats` gauges of `yieldstar metrics`,
      scrape, used by the HTTP thread only) ------>   read from the ledger on each scrape

This module imports prometheus_client (the optional extra `metrics`), and only the `supervise`
command imports this module, when `--metrics` is given: neither a plain install nor a worker
process loads it (the children report step times in their `Done`, and never import it).

The `stats` gauges are read on each scrape (`LedgerGauges`), not refreshed by the loop: one
`executions.stats()` is one read transaction of counts, as `yieldstar metrics` makes it, on a
connection of the HTTP thread's own, so a scrape never delays the loop's heartbeats or claims
(on SQLite a reader does not block the writers, and on PostgreSQL it is one more session), and a
supervisor nobody scrapes reads nothing. Concurrent scrapes take turns on that connection.

Every metric is in a registry of the supervisor's own, not prometheus_client's global one: the
process's own collectors (gc, platform) are not the supervisor's to publish, and two
supervisors in one process (the tests) must not share their counts.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .delivery_metrics import DeliveryMetrics
from .ledger.backends import open_backend
from .ledger.errors import StorageError
from .metrics import families
from .pool import Delivery

log = logging.getLogger("yieldstar.supervisor")

__all__ = ["PrometheusMetrics", "MetricsServer", "serve_metrics"]

# From 5 ms to an hour: a step or delivery may be a cache read or a long call, a claim delay
# may be a nudge's few ms or a backlog's minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

# `metrics` counts every execution with unacknowledged deliveries, so it reads them all (as the
# `metrics` command does).
ALL = 2 ** 62


class PrometheusMetrics(DeliveryMetrics):
    """The loop's reports (`DeliveryMetrics`) as histograms and counters in `registry`.

    Each labelled child is looked up once and kept: `labels()` takes a lock and builds a key
    on every call, which a loop of thousands of deliveries a second need not pay each time."""

    def __init__(self, registry: CollectorRegistry):
        self.delivery_seconds = Histogram(
            "yieldstar_delivery_seconds", "Deliveries of this supervisor from claim to end, by workflow, queue and"
            " outcome.", ["workflow", "queue", "outcome"], registry=registry, buckets=BUCKETS)
        self.step_seconds = Histogram(
            "yieldstar_step_seconds", "Step attempts of this supervisor's deliveries, from the step's start to its"
            " recorded outcome, by workflow.", ["workflow"], registry=registry, buckets=BUCKETS)
        self.claim_delay_seconds = Histogram(
            "yieldstar_claim_delay_seconds", "How long the executions this supervisor claimed had been due when"
            " claimed, by workflow and queue.", ["workflow", "queue"], registry=registry, buckets=BUCKETS)
        self.outcomes = Counter(
            "yieldstar_outcomes", "Deliveries of this supervisor by how they ended (completed, failed, suspended,"
            " released, lost; crashed or killed: the worker died or was killed and the lease left to expire).",
            ["workflow", "queue", "outcome"], registry=registry)
        self.lost_leases = Counter(
            "yieldstar_lost_leases", "Deliveries of this supervisor whose lease was found lost (or whose execution"
            " ended in the ledger, cancelled) before they ended.", ["workflow", "queue"], registry=registry)
        self.storage_errors = Counter(
            "yieldstar_storage_errors", "Ledger calls of this supervisor that met a storage error, by ledger method.",
            ["call"], registry=registry)
        self._children: dict[tuple, object] = {}

    def _child(self, metric, *labels: str):
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def claimed(self, delivery: Delivery, due_at: Optional[int]) -> None:
        if due_at is not None:
            delay_s = max(delivery.claimed_at - due_at, 0) / 1000
            self._child(self.claim_delay_seconds, delivery.workflow, delivery.queue).observe(delay_s)

    def steps_ran(self, delivery: Delivery, seconds: Sequence[float]) -> None:
        if seconds:
            histogram = self._child(self.step_seconds, delivery.workflow)
            for each in seconds:
                histogram.observe(each)

    def ended(self, delivery: Delivery, outcome: str, now: float) -> None:
        labels = (delivery.workflow, delivery.queue, outcome)
        self._child(self.delivery_seconds, *labels).observe(max(now - delivery.since, 0.0))
        self._child(self.outcomes, *labels).inc()
        if outcome == "lost":
            self._child(self.lost_leases, delivery.workflow, delivery.queue).inc()

    def storage_error(self, call: str) -> None:
        self._child(self.storage_errors, call).inc()


class LedgerGauges:
    """A custom collector: the families of `yieldstar metrics` (`metrics.families`), read from
    the ledger on each scrape (see the module docstring). A scrape that meets a storage error
    serves the supervisor's own metrics without these, logs why, and opens the ledger again
    on the next one."""

    def __init__(self, db_path: str, durability: str = "normal"):
        self._db_path = db_path
        self._durability = durability
        self._backend = None
        self._lock = threading.Lock()  # scrapes are served on threads of their own: one reads at a time

    def collect(self):
        with self._lock:
            try:
                if self._backend is None:
                    self._backend = open_backend(self._db_path, durability=self._durability)
                stats = self._backend.executions.stats(limit=ALL)
            except StorageError as exc:
                log.warning("metrics: cannot read the ledger's counts for this scrape: %s", exc,
                            extra={"event": "metrics_gauges_failed", "error": str(exc)})
                self.close()
                return
        for name, kind, help_text, samples in families(stats, unacknowledged=len(stats.unacknowledged)):
            keys = sorted({key for labels, _ in samples for key in labels})
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_text, labels=keys)
            for labels, value in samples:
                family.add_metric([str(labels.get(key, "")) for key in keys], float(value))
            yield family

    def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


class MetricsServer:
    """The HTTP server on its thread, its registry and what fills it; `close` stops it."""

    def __init__(self, httpd, thread: threading.Thread, registry: CollectorRegistry, metrics: PrometheusMetrics,
                 gauges: LedgerGauges):
        self._httpd = httpd
        self._thread = thread
        self.registry = registry
        self.metrics = metrics
        self._gauges = gauges

    @property
    def address(self) -> tuple[str, int]:
        """The host and port it listens on (the port chosen by the system when asked for 0)."""
        host, port = self._httpd.server_address[:2]
        return host, port

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
        self._gauges.close()


def serve_metrics(host: str, port: int, db_path: str, durability: str = "normal") -> MetricsServer:
    """Listen on (host, port) and serve `/metrics` from a new registry on a daemon thread.

    Raises:
        OSError: the address cannot be listened on (in use, not this host's, not permitted).
    """
    registry = CollectorRegistry()  # not auto_describe: registering must not read the ledger
    metrics = PrometheusMetrics(registry)
    gauges = LedgerGauges(db_path, durability)
    registry.register(gauges)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(httpd, thread, registry, metrics, gauges)
