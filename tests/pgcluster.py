"""The test suite's PostgreSQL server (see `supervisor.chaos.cluster`)."""

from __future__ import annotations

from supervisor.chaos.cluster import Cluster, available


def cluster_fixture():
    """The body of the session's `pg_cluster` fixture: a started cluster, or a skip saying why
    not (a failure under CI=true, where both backends must run)."""
    from faults import needs

    needs(available(), "PostgreSQL tests")
    cluster = Cluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
