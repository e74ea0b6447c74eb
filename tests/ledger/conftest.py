"""The ledger's tests: `backend`, the ledger every contract test works on."""

from __future__ import annotations

import pytest

from supervisor import open_backend


@pytest.fixture
def backend(each_backend, clock):
    """A ledger on each backend in turn, on the fake clock."""
    with open_backend(each_backend, clock=clock) as opened:
        yield opened
