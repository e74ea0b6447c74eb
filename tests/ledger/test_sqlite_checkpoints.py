"""The ledger's WAL is copied back into the database file every `WAL_AUTOCHECKPOINT_PAGES`
pages, not SQLite's default 1000 (see "Checkpoints" in `supervisor.ledger.sqlite.connection`):
one process's WAL grows to that length, is checkpointed, and starts again from its beginning."""

from __future__ import annotations

import os

import pytest

from supervisor import open_backend
from supervisor.ledger.sqlite.connection import WAL_AUTOCHECKPOINT_PAGES

pytestmark = pytest.mark.timeout(120)

FRAME_HEADER, WAL_HEADER = 24, 32


def test_the_wal_grows_to_the_checkpoint_length_and_no_further(tmp_path):
    path = str(tmp_path / "ledger.db")
    sizes = []  # the WAL file's size every 500 admissions (it keeps its longest length)
    with open_backend(path) as backend:
        for n in range(40_000):  # a few pages per admission: several checkpoints' worth
            backend.executions.admit(f"e{n}", "wf", "null")
            if n % 500 == 499:
                sizes.append(os.path.getsize(path + "-wal"))
    page = 4096  # SQLite's default page size, which the ledger keeps
    longest = (max(sizes) - WAL_HEADER) // (FRAME_HEADER + page)
    assert WAL_AUTOCHECKPOINT_PAGES <= longest <= WAL_AUTOCHECKPOINT_PAGES + 20, longest
    # Reached early, then written over again and again from its beginning: checkpointed. (The
    # length reached varies by the few frames of the transaction that crossed the threshold: an
    # admission writes a page of each index it changes.)
    reached = next(i for i, size in enumerate(sizes) if size >= max(sizes) - 4 * (FRAME_HEADER + page))
    assert reached < len(sizes) // 2, sizes
