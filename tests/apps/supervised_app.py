"""Workflows for the supervisor's multi-process tests, loaded by path as a supervisor's APP.

Every workflow is an importable top-level function registered on `worker.default_registry`
(names start with `sv.` so they cannot clash with other apps). They leave evidence outside the
ledger, so a test can see what really ran, in which process and under which fencing token:

- a **side-effect log** (`input["log"]`): steps append one line per event,
  `<event> <execution_id> <token> <pid> <step_key> <time_ns>`, with a single `O_APPEND` write,
  so lines from concurrent processes never interleave (see `read_log` in `tests/faults.py`);
- **gates**: a step that must wait for the test polls for a file (`input["gate"]`) to appear,
  with a deadline so that a forgotten gate fails the step instead of hanging the test;
- **counters**: `sv.retry` counts its deliveries in a file, because a delivery that replies
  retry writes nothing to the ledger.
"""

from __future__ import annotations

import asyncio
import os
import time

from supervisor.ledger.errors import StorageBusy
from worker import workflow

GATE_TIMEOUT_S = 60.0

# A heavy app (one that imports big libraries) takes seconds to load in each new worker; a test
# sets this to make loading this app that slow.
IMPORT_DELAY_S = float(os.environ.get("SV_IMPORT_DELAY_S", "0"))
if IMPORT_DELAY_S:
    time.sleep(IMPORT_DELAY_S)
# Or each worker slower than the one before: the n-th import (counted in a file) takes n times
# SV_IMPORT_STAGGER_S, so the first workers are ready long before the last.
IMPORT_STAGGER_S = float(os.environ.get("SV_IMPORT_STAGGER_S", "0"))
if IMPORT_STAGGER_S:
    with open(os.environ["SV_IMPORT_COUNTER"], "a+") as counter:
        counter.write("x")
        counter.seek(0)
        time.sleep(IMPORT_STAGGER_S * len(counter.read()))
# The system clock stepped (NTP, a virtual machine resumed from a snapshot) after the supervisor
# started: from now on every wall-clock time derived from the boot time reads this much later
# in the worker, as the kernel's boot time moves with the clock.
BOOT_TIME_SHIFT_S = float(os.environ.get("SV_BOOT_TIME_SHIFT_S", "0"))
if BOOT_TIME_SHIFT_S:
    import psutil._pslinux as _pslinux

    _boot_time = _pslinux.boot_time
    _pslinux.boot_time = lambda: _boot_time() + BOOT_TIME_SHIFT_S


# -- step bodies --------------------------------------------------------------------------------

def log_event(log: str, event: str, execution_id: str, token: int, step_key: str) -> None:
    line = f"{event} {execution_id} {token} {os.getpid()} {step_key} {time.time_ns()}\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def wait_for_file(path: str, timeout: float = GATE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} did not appear within {timeout} s")
        time.sleep(0.01)


def logged_step(log: str, execution_id: str, token: int, key: str, sleep_s: float = 0.0) -> int:
    """Log `begin`, optionally sleep, log `end`; returns the pid that ran the step."""
    log_event(log, "begin", execution_id, token, key)
    if sleep_s:
        time.sleep(sleep_s)
    log_event(log, "end", execution_id, token, key)
    return os.getpid()


def held_step(log: str, execution_id: str, token: int, gate: str, hold_tokens) -> int:
    """Log `waiting`; when `token` is in `hold_tokens` (None: every token), wait for `gate`."""
    log_event(log, "waiting", execution_id, token, "hold")
    if hold_tokens is None or token in hold_tokens:
        wait_for_file(gate)
    log_event(log, "end", execution_id, token, "hold")
    return os.getpid()


def crashing_step(log: str, execution_id: str, token: int, crash_tokens) -> int:
    """Log `begin`; on a token in `crash_tokens`, end the process abruptly (no cleanup at all)."""
    log_event(log, "begin", execution_id, token, "crash")
    if token in crash_tokens:
        os._exit(70)
    log_event(log, "end", execution_id, token, "crash")
    return os.getpid()


def rendezvous_step(folder: str, execution_id: str, n: int, timeout: float) -> int:
    """Leave a marker, then wait until `n` markers exist: it returns only if `n` ran at once."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, execution_id), "w"):
        pass
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(os.listdir(folder))} of {n} deliveries started within {timeout} s")
        time.sleep(0.01)
    return len(os.listdir(folder))


def nothing() -> None:
    return None


# -- workflows ----------------------------------------------------------------------------------

@workflow("sv.noop3")
def noop3(ctx, input):
    """Three recorded no-op steps: the benchmark's unit of work."""
    for key in ("one", "two", "three"):
        ctx.run(key, nothing)
    return "ok"


@workflow("sv.steps")
def steps(ctx, input):
    """`input["steps"]` logged steps `s0`, `s1`, ..., each sleeping `input["sleep"]` seconds."""
    pids = []
    for i in range(input["steps"]):
        pids.append(ctx.run(f"s{i}", logged_step, input["log"], ctx.execution_id, ctx.token, f"s{i}",
                            input.get("sleep", 0.0)))
    return {"token": ctx.token, "pids": sorted(set(pids))}


@workflow("sv.hold")
def hold(ctx, input):
    """Step `before`, then step `hold` (waits for `input["gate"]` on the tokens listed in
    `input["hold_tokens"]`, every token when absent), then step `after`."""
    return _before_hold_after(ctx, input)


@workflow("sv.crash")
def crash(ctx, input):
    """Step `before`, then step `crash` which kills its own process on `input["crash_tokens"]`."""
    log = input["log"]
    ctx.run("before", logged_step, log, ctx.execution_id, ctx.token, "before")
    pid = ctx.run("crash", crashing_step, log, ctx.execution_id, ctx.token, input["crash_tokens"])
    return {"token": ctx.token, "pid": pid}


@workflow("sv.rendezvous")
def rendezvous(ctx, input):
    """One step that completes only if `input["n"]` deliveries of this workflow run at once."""
    return ctx.run("meet", rendezvous_step, input["dir"], ctx.execution_id, input["n"], input.get("timeout", 30.0))


@workflow("sv.retry")
def retry(ctx, input):
    """Replies retry (a busy database) on its first `input["retries"]` deliveries; then, with
    `input["nap"]`, sleeps that many seconds on a durable timer; then runs like `sv.hold`."""
    with open(input["count_file"], "a") as f:
        f.write(f"{ctx.token}\n")
    with open(input["count_file"]) as f:
        delivery = len(f.readlines())
    if delivery <= input["retries"]:
        raise StorageBusy(f"simulated busy database on delivery {delivery}")
    if input.get("nap"):
        ctx.sleep("nap", input["nap"])
    return _before_hold_after(ctx, input)


@workflow("sv.finish_late")
def finish_late(ctx, input):
    """Steps `before` and `after`; then, on `input["hold_tokens"]`, the workflow function itself
    (no step, so nothing more is written) waits for `input["gate"]`, logs `finishing` and returns:
    the delivery's only remaining write is its acknowledgement."""
    log = input["log"]
    ctx.run("before", logged_step, log, ctx.execution_id, ctx.token, "before")
    ctx.run("after", logged_step, log, ctx.execution_id, ctx.token, "after")
    log_event(log, "waiting", ctx.execution_id, ctx.token, "-")
    if ctx.token in input["hold_tokens"]:
        wait_for_file(input["gate"])
    log_event(log, "finishing", ctx.execution_id, ctx.token, "-")
    return {"token": ctx.token, "pid": os.getpid()}


@workflow("sv.nap")
def nap(ctx, input):
    """A durable timer of `input["seconds"]`, then one logged step."""
    ctx.sleep("nap", input["seconds"])
    return ctx.run("after", logged_step, input["log"], ctx.execution_id, ctx.token, "after")


def _before_hold_after(ctx, input):
    log = input["log"]
    ctx.run("before", logged_step, log, ctx.execution_id, ctx.token, "before")
    pid = ctx.run("hold", held_step, log, ctx.execution_id, ctx.token, input["gate"], input.get("hold_tokens"))
    ctx.run("after", logged_step, log, ctx.execution_id, ctx.token, "after")
    return {"token": ctx.token, "pid": pid}


# -- async workflows ----------------------------------------------------------------------------

async def async_logged_step(log: str, execution_id: str, token: int, key: str) -> str:
    """`logged_step` as a coroutine: it yields to the event loop between its two lines."""
    log_event(log, "begin", execution_id, token, key)
    await asyncio.sleep(0.001)
    log_event(log, "end", execution_id, token, key)
    return key


@workflow("sv.async3")
async def async3(ctx, input):
    """Three logged steps of an `async def` workflow: async, a durable timer of
    `input["pause"]` seconds (if any), sync, async."""
    log = input["log"]
    one = await ctx.run("one", async_logged_step, log, ctx.execution_id, ctx.token, "one")
    if input.get("pause"):
        await ctx.sleep("pause", input["pause"])
    await ctx.run("two", logged_step, log, ctx.execution_id, ctx.token, "two")
    three = await ctx.run("three", async_logged_step, log, ctx.execution_id, ctx.token, "three")
    return [one, "two", three]


@workflow("sv.async_hold")
async def async_hold(ctx, input):
    """`sv.hold` as an `async def` workflow: `before`, `hold` (gated on `hold_tokens`), `after`."""
    log = input["log"]
    await ctx.run("before", logged_step, log, ctx.execution_id, ctx.token, "before")
    pid = await ctx.run("hold", held_step, log, ctx.execution_id, ctx.token, input["gate"], input.get("hold_tokens"))
    await ctx.run("after", async_logged_step, log, ctx.execution_id, ctx.token, "after")
    return {"token": ctx.token, "pid": pid}


# -- many deliveries in one worker (`supervise --workers`) ---------------------------------------

async def async_gate_step(log: str, execution_id: str, token: int, gate: str, hold_tokens=None) -> int:
    """Log `waiting`, then, when `token` is in `hold_tokens` (None: every token), wait for `gate`
    without blocking the event loop (the worker's other deliveries run meanwhile); log `end`;
    returns the pid."""
    log_event(log, "waiting", execution_id, token, "hold")
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(gate) and (hold_tokens is None or token in hold_tokens):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} did not appear within {GATE_TIMEOUT_S} s")
        await asyncio.sleep(0.01)
    log_event(log, "end", execution_id, token, "hold")
    return os.getpid()


@workflow("sv.async_gate")
async def async_gate(ctx, input):
    """`before`, `hold` (awaits `input["gate"]` on the event loop, on the tokens listed in
    `input["hold_tokens"]`, every token when absent), `after`."""
    log = input["log"]
    await ctx.run("before", async_logged_step, log, ctx.execution_id, ctx.token, "before")
    pid = await ctx.run("hold", async_gate_step, log, ctx.execution_id, ctx.token, input["gate"],
                        input.get("hold_tokens"))
    await ctx.run("after", async_logged_step, log, ctx.execution_id, ctx.token, "after")
    return {"token": ctx.token, "pid": pid}


def stubborn_step(log: str, execution_id: str, token: int, seconds: float, stubborn_tokens) -> int:
    """Log `begin`; on a token in `stubborn_tokens`, sleep `seconds` (a step that no stop
    reaches: only its next write would be refused); log `end`."""
    log_event(log, "begin", execution_id, token, "stubborn")
    if token in stubborn_tokens:
        time.sleep(seconds)
    log_event(log, "end", execution_id, token, "stubborn")
    return os.getpid()


@workflow("sv.stubborn")
def stubborn(ctx, input):
    """Step `before`, then step `stubborn` (sleeps on `input["stubborn_tokens"]`)."""
    log = input["log"]
    ctx.run("before", logged_step, log, ctx.execution_id, ctx.token, "before")
    pid = ctx.run("stubborn", stubborn_step, log, ctx.execution_id, ctx.token, input["seconds"],
                  input["stubborn_tokens"])
    return {"token": ctx.token, "pid": pid}


@workflow("sv.deploy")
def deploy(ctx, input):
    """A workflow whose code is "deployed" by the test: the step charged is named by the file
    `input["code"]` (read on every replay, as new code would be), and its timer `cool-off`
    waits `input["seconds"]`. Each step run logs `begin`/`end`."""
    with open(input["code"]) as f:
        charge_key = f.read().strip()
    ctx.run(charge_key, logged_step, input["log"], ctx.execution_id, ctx.token, charge_key)
    ctx.sleep("cool-off", input["seconds"])
    return ctx.run("ship", logged_step, input["log"], ctx.execution_id, ctx.token, "ship") and "shipped"
