"""Workflow registration (`@workflow("name")`): the registry an app fills by being imported.

Loading an app by module name or path is the runtime's (`worker._runtime.loading`)."""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar

from supervisor.ledger.arguments import identifier
from supervisor.ledger.errors import AppNotFound, InvalidArgument, YieldstarError

WorkflowFunction = Callable[[Any, Any], Any]
# What `@workflow` decorates: returned as it came, so a type checker keeps its own signature.
W = TypeVar("W", bound=WorkflowFunction)


class Registry:
    """Workflow names mapped to the functions `f(ctx, input)` that run them."""

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowFunction] = {}

    def workflow(self, name: str) -> Callable[[W], W]:
        identifier("workflow name", name)

        def register(fn: W) -> W:
            if not callable(fn):
                raise InvalidArgument(f"@workflow({name!r}) must decorate a function")
            known = self._workflows.get(name)
            if known is not None and _origin(known) != _origin(fn):
                raise InvalidArgument(
                    f"workflow {name!r} is already registered by {_origin(known)}; refusing {_origin(fn)}"
                )
            self._workflows[name] = fn
            fn.workflow_name = name  # type: ignore[attr-defined]
            return fn

        return register

    def get(self, name: str) -> Optional[WorkflowFunction]:
        return self._workflows.get(name)

    def names(self) -> list[str]:
        return sorted(self._workflows)

    def __contains__(self, name: object) -> bool:
        return name in self._workflows


def _origin(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# The registry that `@workflow` fills; an app module registers its workflows by being imported.
default_registry = Registry()


def workflow(name: str) -> Callable[[W], W]:
    """Register `f(ctx, input)` as the workflow called `name`."""
    return default_registry.workflow(name)
