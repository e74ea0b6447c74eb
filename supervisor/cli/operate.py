"""Commands that act on executions: `cancel`, `resume`, and `purge` (SPEC section 8)."""

from __future__ import annotations
