"""Workflow registration (`@workflow("name")`): the registry an app fills by being imported.

Loading an app by module name or path is the runtime's (`worker._runtime.loading`)."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from supervisor.ledger.arguments import identifier
from supervisor.ledger.errors import AppNotFound, InvalidArgument, YieldstarError
from supervisor.ledger.ticks import Schedule, schedule_of

WorkflowFunction = Callable[[Any, Any], Any]
# What `@workflow` decorates: returned as it came, so a type checker keeps its own signature.
W = TypeVar("W", bound=WorkflowFunction)


class Registry:
    """Workflow names mapped to the functions `f(ctx, input)` that run them."""

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowFunction] = {}
        self._schedules: dict[str, Schedule] = {}

    def workflow(self, name: str, *, schedule: Optional[str] = None, timezone: Optional[str] = None,
                 every: Optional[float] = None) -> Callable[[W], W]:
        """`schedule` (a cron expression, in UTC unless `timezone`) or `every` (seconds) makes the
        supervisors that serve the workflow admit it at each tick (SPEC section 12); both are
        checked here, so a bad one fails the app's import."""
        identifier("workflow name", name)
        ticking = schedule_of(name, schedule=schedule, timezone=timezone, every=every)

        def register(fn: W) -> W:
            if not callable(fn):
                raise InvalidArgument(f"@workflow({name!r}) must decorate a function")
            known = self._workflows.get(name)
            if known is not None and _origin(known) != _origin(fn):
                raise InvalidArgument(
                    f"workflow {name!r} is already registered by {_origin(known)}; refusing {_origin(fn)}"
                )
            self._workflows[name] = fn
            if ticking is not None:
                self._schedules[name] = ticking
            fn.workflow_name = name  # type: ignore[attr-defined]
            return fn

        return register

    def get(self, name: str) -> Optional[WorkflowFunction]:
        return self._workflows.get(name)

    def names(self) -> list[str]:
        return sorted(self._workflows)

    def schedules(self) -> list[Schedule]:
        """The schedules of the registered workflows, by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]

    def __contains__(self, name: object) -> bool:
        return name in self._workflows


def _origin(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# The registry that `@workflow` fills; an app module registers its workflows by being imported.
default_registry = Registry()


def workflow(name: str, *, schedule: Optional[str] = None, timezone: Optional[str] = None,
             every: Optional[float] = None) -> Callable[[W], W]:
    """Register `f(ctx, input)` as the workflow called `name`; with `schedule=` (cron, UTC unless
    `timezone=`) or `every=` (seconds), admitted at each tick with input `{"scheduled_at": TICK}`."""
    return default_registry.workflow(name, schedule=schedule, timezone=timezone, every=every)
