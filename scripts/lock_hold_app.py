"""Workflows for scripts/bench_lock_hold.py, loaded by path as the supervisor's APP.

- `lockhold.step`: one step that sleeps `input["seconds"]`, logging `begin` before and `end`
  after to a side-effect log (`input["log"]`), one line per event,
  `<event> <execution_id> <token> <pid> <time_ns>`, each written with a single `O_APPEND` write
  so that lines from concurrent workers never interleave. A step whose body ran twice shows as two
  `begin` lines for one execution.
- `lockhold.ticker`: a durable timer every `input["every_s"]`, for ever: the supervisor claims
  and acknowledges it a few times a second, as it would any timer-driven workflow, so its loop
  needs the database while the benchmark holds the write lock.
"""

from __future__ import annotations

import itertools
import os
import time

from worker import workflow


def log_event(log: str, event: str, execution_id: str, token: int) -> None:
    # Mode "a" is O_APPEND, and the line leaves the buffer in one write() when the file closes.
    with open(log, "a") as f:
        f.write(f"{event} {execution_id} {token} {os.getpid()} {time.time_ns()}\n")


def long_step(log: str, execution_id: str, token: int, seconds: float) -> int:
    log_event(log, "begin", execution_id, token)
    time.sleep(seconds)
    log_event(log, "end", execution_id, token)
    return token


@workflow("lockhold.step")
def step(ctx, input):
    return ctx.run("work", long_step, input["log"], ctx.execution_id, ctx.token, input["seconds"])


@workflow("lockhold.ticker")
def ticker(ctx, input):
    for tick in itertools.count():
        ctx.sleep(f"tick-{tick}", input["every_s"])
