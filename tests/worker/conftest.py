"""The worker's tests: `sqlite_backend`, the ledger deliveries are run against by hand."""

from __future__ import annotations

import pytest

from supervisor import open_backend


@pytest.fixture
def sqlite_backend(sqlite_path, clock):
    """A SQLite ledger on the fake clock. A 1 ms redelivery delay, so a lease that expires can be
    claimed again right after."""
    with open_backend(sqlite_path, clock=clock, redelivery_delay=lambda n: 1) as opened:
        yield opened
