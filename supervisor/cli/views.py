"""Commands that summarise a ledger: `stats`, `metrics`, and the live view `top`."""

from __future__ import annotations
