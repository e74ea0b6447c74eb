"""The skewed ledger clock of a chaos run's supervisor, and of its workers.

A chaos run with `clock_skew` gives some of its supervisors a ledger clock that runs ahead of or
behind the others' on the same host. The harness starts such a supervisor with this folder first
on PYTHONPATH and the skew in `YIELDSTAR_CHAOS_CLOCK_SKEW_MS` (an int, in ms, may be negative:
`supervisor.chaos.fleet.skewed_env`); its workers are fresh interpreters that inherit both. Python
imports this module when each of them starts, and it replaces the SQLite backend's default clock
(`wall_clock`) with one that adds the skew, so every backend opened there without a `clock=`
follows it. The backend itself reads no variable of a chaos run. A value that is not an int ends
the interpreter at once (exit code 2), naming the variable.

It then runs the `sitecustomize` this one hides, if the installation has one.
"""

import importlib.machinery
import importlib.util
import os
import sys

CLOCK_SKEW_ENV = "YIELDSTAR_CHAOS_CLOCK_SKEW_MS"


def skew_the_ledger_clock() -> None:
    text = os.environ.get(CLOCK_SKEW_ENV, "").strip()
    if not text:
        return
    try:
        skew = int(text)
    except ValueError:
        # Not SystemExit: raised while the interpreter starts, it would be a fatal error and a traceback.
        sys.stderr.write(f"{CLOCK_SKEW_ENV} must be an int number of milliseconds, got {text!r}\n")
        sys.stderr.flush()
        os._exit(2)
    from supervisor.ledger.sqlite import backend

    wall_clock = backend.wall_clock

    def skewed_wall_clock() -> int:
        return wall_clock() + skew

    backend.wall_clock = skewed_wall_clock


def run_the_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


skew_the_ledger_clock()
run_the_hidden_sitecustomize()
