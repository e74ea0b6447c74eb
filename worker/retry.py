"""Step retries: the policy, and the error a step raises to ask for a retry.

A step that failed for good is raised into its workflow as `StepFailed` (`supervisor.ledger.errors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from supervisor.ledger.arguments import finite
from supervisor.ledger.errors import InvalidArgument


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing step is tried again: up to `max_attempts` attempts in all, attempt n
    waiting `min(interval * backoff ** (n - 1), max_interval)` seconds after it failed.

    The same settings, by the same names, as `RetryableError(max_attempts=, interval=, backoff=)`.
    """

    max_attempts: int = 3
    interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("interval", "max_interval"):
            value = getattr(self, name)
            if not finite(value) or value < 0:
                raise InvalidArgument(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if not finite(self.backoff) or self.backoff < 1:
            raise InvalidArgument(f"backoff must be a finite number >= 1, got {self.backoff!r}")

    def delay_ms(self, attempt: int) -> int:
        """The wait after failed attempt `attempt` (1-based), in ms."""
        seconds = min(self.interval * self.backoff ** (attempt - 1), self.max_interval)
        return int(seconds * 1000)


class RetryableError(Exception):
    """Raise from a step to have it tried again later, up to `max_attempts` attempts in all,
    `interval` seconds apart (growing by `backoff`): a `RetryPolicy` of those settings, whose
    waits are capped at 300 s or `interval`, whichever is longer.

    Not a `YieldstarError`: the workflow's own code raises it, for the runtime to act on."""

    def __init__(self, message: str = "", *, max_attempts: int = 3, interval: float = 1.0, backoff: float = 1.0):
        super().__init__(message)
        self.policy = RetryPolicy(max_attempts=max_attempts, interval=interval, backoff=backoff,
                                  max_interval=max(interval, 300.0))
