"""The step threads this worker process could not stop, and so why it must be replaced.

A sync step that runs past its timeout (`worker.timeouts`) is abandoned: Python cannot end a
thread, so it runs on in the process, holding whatever it holds. The process is what must go: a
worker reports every `Done` with `replace_reason()`, and the supervisor kills a worker whose
report names one, starts another, and releases the worker's other deliveries at once.

This is process-wide state on purpose: it is a fact about the process, not about one delivery.
"""

from __future__ import annotations

import threading
from typing import Optional

_lock = threading.Lock()
_abandoned: list[tuple[threading.Thread, str]] = []


def abandon(thread: threading.Thread, why: str) -> None:
    """Note that `thread` runs on, unstoppable, because of `why` (a step's timeout)."""
    with _lock:
        _abandoned.append((thread, why))


def replace_reason() -> Optional[str]:
    """Why this process must be replaced: the first abandoned thread still running, or None
    (every abandoned thread ended on its own since)."""
    with _lock:
        _abandoned[:] = [(thread, why) for thread, why in _abandoned if thread.is_alive()]
        return _abandoned[0][1] if _abandoned else None
