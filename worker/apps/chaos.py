"""The workflows `yieldstar chaos` runs, and the evidence they leave outside the ledger.

One workflow, `chaos.mixed`, follows a plan written by the harness (a JSON list of operations)
so that every kind of durable call is exercised: plain steps (fast and slow, some slower than a
lease), retried steps (`RetryableError`), durable timers, effects against a fake external
system, a shared counter store, a mailbox store used by producer and consumer executions, and
child executions started and waited for. Plans are data, so a replay takes the same path.
`chaos.mixed_async` is the same workflow written `async def`, its steps awaiting instead of
sleeping: with `supervise --workers`, many of them run as tasks of one worker's event loop.
`chaos.capped`, `chaos.keyed` and `chaos.paced` follow the same plans on limited queues (SPEC
section 12: at most 3 live leases; at most 1 per key; at most 5 claims a second), so that the
checker can count what each claim had to count against the queues' limits.
`chaos.messages` takes messages that the harness sends from outside (SPEC section 14): one
`ctx.recv` per entry of its input's `topics`, each followed by a step (`message_step`) that
carries the message's id into a recorded value, so a worker killed inside it dies after the take.
Its result lists what it received, `[topic, message id]` in recv order, beside the usual token
and fingerprints.

Evidence, all appended with one `O_APPEND` write per line so lines from concurrent processes
never interleave (the checker in `supervisor.chaos.checker` reads it back):

- the **step log** (`<dir>/steps.log`), one line per event, fields separated by spaces:

      begin <execution> <token> <pid> <step key> <time_ns>          a step function starts
      end   <execution> <token> <pid> <step key> <time_ns> <nonce>  it returns; its value carries the nonce
      fail  <execution> <token> <pid> <step key> <time_ns>          it raised RetryableError
      saw   <execution> <token> <pid> <step key> <time_ns> <digest> the workflow continued with this value

  `begin` lines are how the fault injector finds processes that are inside a step right now.
  A step's recorded value names the token and pid that produced it and a fresh nonce, so the
  checker can tie every record in the ledger to the one real step run that produced it;
  `saw` lines let it prove that every delivery continued with the recorded value.

- the **external system** (`<dir>/external/<shard>.log`): a fake provider that honours
  idempotency keys, like a payment API. Under an exclusive `flock` on the key's shard it looks
  the key up; the first request executes and appends
  `execute <effect id> <receipt> <pid> <token> <time_ns> <execution> <step key>`, a repeat
  appends `repeat <effect id> <pid> <token> <time_ns> <execution> <step key>` and gets the first
  receipt back. The line is the record, so a process killed mid-request either executed (line
  written) or did not. The last two fields say who asked, so the checker can tell an effect id
  that two executions share.

- the **import log**: with `YIELDSTAR_CHAOS_IMPORT_DELAY_MS` set (the harness's `slow_start`),
  importing this module takes that long, and, with `YIELDSTAR_CHAOS_IMPORT_LOG` set too, appends
  `importing <pid> <time_ns>` before the delay and `imported <pid> <time_ns>` after it, so the
  harness can kill workers that are still loading the app.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import random
import time
from typing import Any

from worker import Queue, RetryableError, StepFailed, workflow

MIXED = "chaos.mixed"
MIXED_ASYNC = "chaos.mixed_async"
# The same plans on limited queues (SPEC section 12), small enough that a run saturates them: the
# checker finds the most live leases (and claims per window) each queue ever had beside its limits.
CAPPED, KEYED, PACED = "chaos.capped", "chaos.keyed", "chaos.paced"
MESSAGES = "chaos.messages"  # receives the messages the harness sends (`supervisor.chaos.sender`)
CAPPED_QUEUE = Queue("chaos-capped", concurrency=3)
KEYED_QUEUE = Queue("chaos-keyed", per_key=1)
PACED_QUEUE = Queue("chaos-paced", rate=(5, 1.0))
LIMITED_QUEUES = {CAPPED: CAPPED_QUEUE, KEYED: KEYED_QUEUE, PACED: PACED_QUEUE}
COUNTER = "chaos.counter"
MAILBOX = "chaos.mailbox"
STEP_LOG = "steps.log"
EXTERNAL = "external"
EXTERNAL_SHARDS = 64
IMPORT_DELAY_ENV = "YIELDSTAR_CHAOS_IMPORT_DELAY_MS"
IMPORT_LOG_ENV = "YIELDSTAR_CHAOS_IMPORT_LOG"


class ChaosFailure(Exception):
    """A chaos workflow failing on purpose, or because a step it needed failed for good.

    The message always ends with `(token N)`: the checker compares N, the token of the delivery
    that failed the workflow, with the execution's final token."""


def digest(value: Any) -> str:
    """A short fingerprint of a JSON value, the same in every process."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def log_event(folder: str, event: str, execution_id: str, token: int, key: str, extra: str = "") -> None:
    line = f"{event} {execution_id} {token} {os.getpid()} {key} {time.time_ns()}"
    append_line(os.path.join(folder, STEP_LOG), f"{line} {extra}" if extra else line)


# -- the fake external system ----------------------------------------------------------------

def external_shard(folder: str, effect_id: str) -> str:
    shard = int(hashlib.sha1(effect_id.encode()).hexdigest(), 16) % EXTERNAL_SHARDS
    return os.path.join(folder, EXTERNAL, f"{shard:02d}.log")


def external_request(folder: str, effect_id: str, token: int, execution_id: str, key: str) -> dict:
    """Execute the operation named by the idempotency key `effect_id` once; a repeat gets the
    first receipt back and executes nothing. `execution_id` and `key` only say who asked."""
    path = external_shard(folder, effect_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r") as f:
            for line in f:
                fields = line.split()
                if line.endswith("\n") and fields[0] == "execute" and fields[1] == effect_id:
                    os.write(fd, f"repeat {effect_id} {os.getpid()} {token} {time.time_ns()} {execution_id}"
                                 f" {key}\n".encode())
                    return {"effect_id": effect_id, "receipt": fields[2]}
        receipt = os.urandom(8).hex()
        os.write(fd, f"execute {effect_id} {receipt} {os.getpid()} {token} {time.time_ns()} {execution_id}"
                     f" {key}\n".encode())
        return {"effect_id": effect_id, "receipt": receipt}
    finally:
        os.close(fd)  # also drops the lock


def _slow_import() -> None:
    """Sleep at import when the harness asks for a slow start (see the module docstring)."""
    delay_ms = int(os.environ.get(IMPORT_DELAY_ENV) or 0)
    if delay_ms <= 0:
        return
    log = os.environ.get(IMPORT_LOG_ENV)
    if log:
        append_line(log, f"importing {os.getpid()} {time.time_ns()}")
    time.sleep(delay_ms / 1000)
    if log:
        append_line(log, f"imported {os.getpid()} {time.time_ns()}")


_slow_import()


# -- step bodies -----------------------------------------------------------------------------

def _produced(folder: str, execution_id: str, token: int, key: str) -> dict:
    nonce = os.urandom(6).hex()
    log_event(folder, "end", execution_id, token, key, nonce)
    return {"token": token, "pid": os.getpid(), "nonce": nonce}


def _pause(seconds: float) -> None:
    if seconds:
        time.sleep(seconds)


async def _pause_async(seconds: float) -> None:
    if seconds:
        await asyncio.sleep(seconds)  # a lost lease cancels the delivery here


def _flaky(folder: str, execution_id: str, token: int, key: str, p_fail: float, attempts: int,
           interval: float) -> dict:
    if random.random() < p_fail:
        log_event(folder, "fail", execution_id, token, key)
        raise RetryableError(f"flaky step {key} (token {token})", max_attempts=attempts, interval=interval)
    return _produced(folder, execution_id, token, key)


def timed_step(folder: str, execution_id: str, token: int, key: str, seconds: float) -> dict:
    log_event(folder, "begin", execution_id, token, key)
    _pause(seconds)
    return _produced(folder, execution_id, token, key)


async def timed_step_async(folder: str, execution_id: str, token: int, key: str, seconds: float) -> dict:
    log_event(folder, "begin", execution_id, token, key)
    await _pause_async(seconds)
    return _produced(folder, execution_id, token, key)


def flaky_step(folder: str, execution_id: str, token: int, key: str, seconds: float, p_fail: float,
               attempts: int, interval: float) -> dict:
    log_event(folder, "begin", execution_id, token, key)
    _pause(seconds)
    return _flaky(folder, execution_id, token, key, p_fail, attempts, interval)


async def flaky_step_async(folder: str, execution_id: str, token: int, key: str, seconds: float, p_fail: float,
                           attempts: int, interval: float) -> dict:
    log_event(folder, "begin", execution_id, token, key)
    await _pause_async(seconds)
    return _flaky(folder, execution_id, token, key, p_fail, attempts, interval)


def message_step(folder: str, execution_id: str, token: int, key: str, message_id: str, seconds: float) -> dict:
    """The step after a recv: its value names the message taken, as a handler's effect would."""
    log_event(folder, "begin", execution_id, token, key)
    _pause(seconds)
    return dict(_produced(folder, execution_id, token, key), message=message_id)


def effect_call(folder: str, execution_id: str, token: int, key: str, effect_id: str, before: float,
                after: float) -> dict:
    """Ask the external system; `after` is a pause between its executing and our hearing back,
    the window in which a holder that dies leaves an executed but unsettled effect."""
    log_event(folder, "begin", execution_id, token, key)
    _pause(before)
    result = external_request(folder, effect_id, token, execution_id, key)
    _pause(after)
    log_event(folder, "end", execution_id, token, key, result["receipt"])
    return result


async def effect_call_async(folder: str, execution_id: str, token: int, key: str, effect_id: str, before: float,
                            after: float) -> dict:
    """`effect_call`, awaiting its pauses. (The request itself is a short locked file append.)"""
    log_event(folder, "begin", execution_id, token, key)
    await _pause_async(before)
    result = external_request(folder, effect_id, token, execution_id, key)
    await _pause_async(after)
    log_event(folder, "end", execution_id, token, key, result["receipt"])
    return result


# -- the workflow ----------------------------------------------------------------------------

def _saw(ctx, folder: str, key: str, value: Any, seen: dict) -> Any:
    fingerprint = digest(value)
    seen[key] = fingerprint
    log_event(folder, "saw", ctx.execution_id, ctx.token, key, fingerprint)
    return value


def _perform(ctx, folder: str, op: list, seen: dict) -> None:
    kind, key = op[0], op[1]
    eid, token = ctx.execution_id, ctx.token
    if kind == "run":
        value = ctx.run(key, timed_step, folder, eid, token, key, op[2])
    elif kind == "retry":
        value = ctx.run(key, flaky_step, folder, eid, token, key, *op[2:])
    elif kind == "sleep":
        value = ctx.sleep(key, op[2])
    elif kind == "effect":
        value = ctx.effect(key, lambda effect_id: effect_call(folder, eid, token, key, effect_id, op[2], op[3]))
    elif kind == "child":
        child = ctx.start(key, MIXED, {"dir": folder, "plan": op[2]})
        _saw(ctx, folder, key, child, seen)
        key = f"{key}.wait"
        value = ctx.wait_for(child, key=key)
    else:
        value = _store_call(ctx, op, eid)
    _saw(ctx, folder, key, value, seen)


async def _perform_async(ctx, folder: str, op: list, seen: dict) -> None:
    """`_perform`, awaited; a child is a `chaos.mixed_async` too."""
    kind, key = op[0], op[1]
    eid, token = ctx.execution_id, ctx.token
    if kind == "run":
        value = await ctx.run(key, timed_step_async, folder, eid, token, key, op[2])
    elif kind == "retry":
        value = await ctx.run(key, flaky_step_async, folder, eid, token, key, *op[2:])
    elif kind == "sleep":
        value = await ctx.sleep(key, op[2])
    elif kind == "effect":
        value = await ctx.effect(key, lambda effect_id: effect_call_async(folder, eid, token, key, effect_id, op[2],
                                                                          op[3]))
    elif kind == "child":
        child = await ctx.start(key, MIXED_ASYNC, {"dir": folder, "plan": op[2]})
        _saw(ctx, folder, key, child, seen)
        key = f"{key}.wait"
        value = await ctx.wait_for(child, key=key)
    else:
        value = await _store_call(ctx, op, eid)
    _saw(ctx, folder, key, value, seen)


def _store_call(ctx, op: list, eid: str):
    """A store operation of the plan: its value, or (in an async workflow) its awaitable."""
    kind, key = op[0], op[1]
    if kind == "inc":
        return ctx.store(COUNTER).update(key, lambda n: n + 1)
    if kind == "put":
        item = {"pair": op[2], "from": eid}
        return ctx.store(MAILBOX).update(key, lambda items: items + [item])
    if kind == "take":
        return ctx.store(MAILBOX).take(key, {"pair": op[2]})
    raise ValueError(f"unknown chaos operation {kind!r}")


def _outcome(ctx, input: dict, seen: dict) -> dict:
    if input.get("fail"):
        raise ChaosFailure(f"deliberate failure (token {ctx.token})")
    return {"token": ctx.token, "seen": seen}


@workflow(MIXED)
def mixed(ctx, input: dict) -> dict:
    """Perform `input["plan"]` in order; fail on purpose at the end if `input["fail"]`.

    The result names the token of the delivery that completed the workflow and the fingerprint
    of every value it continued with, so the checker can compare both with the ledger."""
    return _follow(ctx, input)


@workflow(CAPPED, queue=CAPPED_QUEUE)
def capped(ctx, input: dict) -> dict:
    """`mixed` on a queue of at most 3 live leases."""
    return _follow(ctx, input)


@workflow(KEYED, queue=KEYED_QUEUE)
def keyed(ctx, input: dict) -> dict:
    """`mixed` on a queue of at most 1 live lease per key (the harness admits a few keys)."""
    return _follow(ctx, input)


@workflow(PACED, queue=PACED_QUEUE)
def paced(ctx, input: dict) -> dict:
    """`mixed` on a queue of at most 5 claims per second."""
    return _follow(ctx, input)


def _follow(ctx, input: dict) -> dict:
    """The body of every synchronous chaos workflow: the plan, then the outcome."""
    folder = input["dir"]
    seen: dict[str, str] = {}
    for op in input["plan"]:
        try:
            _perform(ctx, folder, op, seen)
        except StepFailed as exc:
            raise ChaosFailure(f"{exc} (token {ctx.token})") from None
    return _outcome(ctx, input, seen)


@workflow(MIXED_ASYNC)
async def mixed_async(ctx, input: dict) -> dict:
    """`mixed`, written `async def`: the same plans, the same evidence, the same result."""
    folder = input["dir"]
    seen: dict[str, str] = {}
    for op in input["plan"]:
        try:
            await _perform_async(ctx, folder, op, seen)
        except StepFailed as exc:
            raise ChaosFailure(f"{exc} (token {ctx.token})") from None
    return _outcome(ctx, input, seen)


@workflow(MESSAGES)
def messages(ctx, input: dict) -> dict:
    """Take one message per entry of `input["topics"]` (`ctx.recv`, waiting as long as it takes),
    each followed by the `run` step of `input["plan"]` in the same place, which records the
    message's id. The messages are JSON objects the harness sends: `{"id", "to", "topic", "n"}`.

    The result lists `[topic, message id]` for each recv in order: the checker compares it with
    the ledger's messages, the recv steps' records and what the harness sent."""
    folder = input["dir"]
    seen: dict[str, str] = {}
    received = []
    eid = ctx.execution_id
    for topic, (_, key, seconds) in zip(input["topics"], input["plan"]):
        message = ctx.recv(topic)
        received.append([topic, message["id"]])
        value = ctx.run(key, message_step, folder, eid, ctx.token, key, message["id"], seconds)
        _saw(ctx, folder, key, value, seen)
    return dict(_outcome(ctx, input, seen), received=received)
