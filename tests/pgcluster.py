"""The test suite's PostgreSQL server (see `supervisor.ledger.postgres.cluster`)."""

from __future__ import annotations

import os

from supervisor.ledger.postgres.cluster import Cluster, available


def cluster_fixture():
    """The body of the session's `pg_cluster` fixture: a started cluster, or a skip saying why
    not (a failure under CI=true, where both backends must run)."""
    import pytest

    why = available()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests, but {why}")
        pytest.skip(f"PostgreSQL tests skipped: {why}")
    cluster = Cluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
