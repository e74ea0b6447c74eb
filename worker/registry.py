"""Workflow registration (`@workflow("name")`): the registry an app fills by being imported.

Loading an app by module name or path is the runtime's (`worker._runtime.loading`)."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from supervisor.ledger.arguments import identifier, seconds_to_ms
from supervisor.ledger.errors import AppNotFound, InvalidArgument, YieldstarError
from supervisor.ledger.tables.queues import DEFAULT_QUEUE, priority as checked_priority
from supervisor.ledger.ticks import Schedule, schedule_of

from .queues import Queue

WorkflowFunction = Callable[[Any, Any], Any]
# What `@workflow` decorates: returned as it came, so a type checker keeps its own signature.
W = TypeVar("W", bound=WorkflowFunction)


class Registry:
    """Workflow names mapped to the functions `f(ctx, input)` that run them."""

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowFunction] = {}
        self._schedules: dict[str, Schedule] = {}
        self._queues: dict[str, Queue] = {}  # the queues the app declares, by name
        self._defaults: dict[str, tuple[str, int, Optional[int]]] = {}  # each workflow's (queue, priority, timeout_ms)

    def workflow(self, name: str, *, queue: Queue | str | None = None, priority: int = 0,
                 schedule: Optional[str] = None, timezone: Optional[str] = None,
                 every: Optional[float] = None, timeout: Optional[float] = None) -> Callable[[W], W]:
        """`queue` (a `Queue`, or a queue's name; "default" when None), `priority` (higher
        first) and `timeout` (seconds > 0 from admission to a `WorkflowTimedOut` failure; None:
        none) are the defaults of its executions' starts. `schedule` (a cron expression, in UTC
        unless `timezone`) or `every` (seconds) makes the supervisors that serve the workflow
        admit it at each tick (SPEC section 12). All are checked here, so a bad one fails the
        app's import."""
        identifier("workflow name", name)
        queue_name = self._queue(queue)
        checked_priority("priority", priority)
        timeout_ms = seconds_to_ms("timeout", timeout)
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
            self._defaults[name] = (queue_name, priority, timeout_ms)
            if ticking is not None:
                self._schedules[name] = ticking
            fn.workflow_name = name  # type: ignore[attr-defined]
            return fn

        return register

    def _queue(self, queue: Queue | str | None) -> str:
        """The name of `queue`, a `Queue` recorded as the app's (one name, one set of limits)."""
        if queue is None:
            return DEFAULT_QUEUE
        if isinstance(queue, str):
            return identifier("queue", queue)
        if not isinstance(queue, Queue):
            raise InvalidArgument(f"queue must be a Queue or a queue name, not {type(queue).__name__}")
        known = self._queues.get(queue.name)
        if known is not None and known != queue:
            raise InvalidArgument(f"queue {queue.name!r} is declared twice with different limits: {known} and {queue}")
        self._queues[queue.name] = queue
        return queue.name

    def queues(self) -> list[Queue]:
        """The queues the app's workflows name as `Queue`s, by name."""
        return [self._queues[name] for name in sorted(self._queues)]

    def defaults(self) -> dict[str, tuple[str, int, Optional[int]]]:
        """Each workflow's default (queue, priority, timeout_ms)."""
        return dict(sorted(self._defaults.items()))

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


def workflow(name: str, *, queue: Queue | str | None = None, priority: int = 0, schedule: Optional[str] = None,
             timezone: Optional[str] = None, every: Optional[float] = None,
             timeout: Optional[float] = None) -> Callable[[W], W]:
    """Register `f(ctx, input)` as the workflow called `name`; its executions go to `queue` (a
    `Queue`, or a queue's name; "default" when None) at `priority` (higher first), and fail as
    `WorkflowTimedOut` if not finished `timeout` seconds after their admission (None: never),
    unless their start names others; with `schedule=` (cron, UTC unless `timezone=`) or `every=`
    (seconds), admitted at each tick with input `{"scheduled_at": TICK}`."""
    return default_registry.workflow(name, queue=queue, priority=priority, schedule=schedule, timezone=timezone,
                                     every=every, timeout=timeout)
