"""The UI's tests' ledger (`ui_story.fill`) on each backend."""

from __future__ import annotations

import pytest
from ui_story import fill


@pytest.fixture
def story(each_backend):
    """`each_backend`'s ledger, filled by `ui_story.fill`; returns its location."""
    return fill(each_backend)
