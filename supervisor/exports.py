"""A package's public names, each imported from its module when first used (PEP 562).

`supervisor` and `worker` export this way, so that a process pays at start-up only for the part
of a package it uses: a worker process does not import the client (and is ready sooner), nor an
app that only defines workflows a ledger backend.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public names are the keys of `where`,
    each found in the (relative) module named by its value."""
    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)  # found once; later look-ups are plain
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(where))

    return __getattr__, __dir__
