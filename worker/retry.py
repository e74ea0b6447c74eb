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
    """How a failing step is tried again: attempt n waits
    `min(initial_interval * backoff_coefficient ** (n - 1), maximum_interval)` seconds."""

    maximum_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.maximum_attempts, int) or isinstance(self.maximum_attempts, bool) \
                or self.maximum_attempts < 1:
            raise InvalidArgument(f"maximum_attempts must be an int >= 1, got {self.maximum_attempts!r}")
        for name in ("initial_interval", "maximum_interval"):
            value = getattr(self, name)
            if not finite(value) or value < 0:
                raise InvalidArgument(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if not finite(self.backoff_coefficient) or self.backoff_coefficient < 1:
            raise InvalidArgument(f"backoff_coefficient must be a finite number >= 1, got {self.backoff_coefficient!r}")

    def delay_ms(self, attempt: int) -> int:
        """The wait after failed attempt `attempt` (1-based), in ms."""
        seconds = min(self.initial_interval * self.backoff_coefficient ** (attempt - 1), self.maximum_interval)
        return int(seconds * 1000)


class RetryableError(Exception):
    """Raise from a step to have it tried again later, up to `max_attempts` attempts in all,
    `interval` seconds apart (growing by `backoff`)."""

    def __init__(self, message: str = "", *, max_attempts: int = 3, interval: float = 1.0, backoff: float = 1.0):
        super().__init__(message)
        self.policy = RetryPolicy(maximum_attempts=max_attempts, initial_interval=interval,
                                  backoff_coefficient=backoff, maximum_interval=max(interval, 300.0))
