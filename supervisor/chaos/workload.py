"""The workload of a chaos run: seeded plans for `chaos.mixed`, and the thread that admits them.

Plans are data (see `worker.apps.chaos`): a list of operations with their keys and timings, drawn
from the run's `random.Random(seed)`, so the same seed gives the same executions, admitted at the
same moments of the fault phase.
One in eight of them runs on a limited queue instead, admitted in bursts that saturate it
(`limited_admissions`), and one in twelve takes messages sent from outside (`message_admissions`,
`sender`).

A run on the user's own workflows (`--app`) takes its workload from the app instead: a function
`chaos_workload(rng, count)` in it returns `count` (or so) `(workflow name, input)` pairs, drawn
from `rng` if they vary; they are admitted evenly over the same window, as `u000000`, `u000001`...
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import random
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Optional

from worker.apps.chaos import KEYED, LIMITED_QUEUES, MESSAGES, MIXED, MIXED_ASYNC

from ..ledger.errors import InvalidArgument, StorageError
from .sender import MESSAGE_SHARE, message_input

CHAOS_APP = "worker.apps.chaos"  # the built-in workload's app
WORKLOAD_FUNCTION = "chaos_workload"  # what an app of the user's defines for `--app`

STORAGE_RETRY_S = 0.02  # between attempts to admit while the ledger is locked or the disk full
LIMITED_SHARE = 8  # one execution in this many goes to a limited queue (`limited_admissions`)
BURST = (6, 10)  # executions per burst into one limited queue: more than any of its limits lets run
KEYS = ("red", "green", "blue")  # the keys of `chaos.keyed`'s executions

@dataclass(frozen=True)
class Admission:
    execution_id: str
    input: object
    at_s: float  # seconds into the fault phase
    workflow: str = MIXED
    key: Optional[str] = None  # the execution's key within its queue (`per_key`)

    @property
    def queue(self) -> str:
        """Its workflow's queue: the admitter names it, as `client.start` would look it up."""
        limited = LIMITED_QUEUES.get(self.workflow)
        return limited.name if limited is not None else "default"


def _op(rng: random.Random, n: int, lease_s: float, *, nested: bool) -> list:
    key = f"k{n}"
    choices = ["run", "slow", "retry", "sleep", "effect", "inc"] + ([] if nested else ["child"])
    weights = [30, 9, 12, 12, 15, 12] + ([] if nested else [6])
    kind = rng.choices(choices, weights)[0]
    if kind == "run":
        return ["run", key, round(rng.uniform(0, 0.03), 3)]
    if kind == "slow":  # one in five outlasts a lease, so only renewals keep it
        seconds = rng.uniform(1.1, 1.8) * lease_s if rng.random() < 0.2 else rng.uniform(0.2, 0.8)
        return ["run", key, round(seconds, 3)]
    if kind == "retry":
        return ["retry", key, round(rng.uniform(0, 0.05), 3), 0.4, 3, round(rng.uniform(0.1, 0.5), 3)]
    if kind == "sleep":
        return ["sleep", key, round(rng.uniform(0.1, 2.0), 3)]
    if kind == "effect":
        return ["effect", key, round(rng.uniform(0, 0.1), 3), round(rng.uniform(0.02, 0.4), 3)]
    if kind == "inc":
        return ["inc", key]
    return ["child", key, [_op(rng, i, lease_s, nested=True) for i in range(1, rng.randint(1, 3) + 1)]]


def collider_plans(rng: random.Random, execution_id: str) -> tuple[tuple[str, list], tuple[str, list]]:
    """Two executions whose step keys would share derived ids if ids were `execution/key`.

    `X` and `X/z`: X's effect `z/k1` and start `z/k2` against X/z's effect `k1` and start `k2`
    (all `X/z/k1` and `X/z/k2`); and, within X, its effect `y/k1` against the effect `k1` of
    its own child started as `y` (the child `X/y`, whose effect would be `X/y/k1` too)."""
    def effect(key: str) -> list:
        return ["effect", key, round(rng.uniform(0, 0.05), 3), round(rng.uniform(0.02, 0.2), 3)]

    first = [effect("z/k1"), ["child", "z/k2", [["run", "k1", 0.01]]], ["child", "y", [effect("k1")]], effect("y/k1")]
    second = [effect("k1"), ["child", "k2", [["run", "k1", 0.02], ["inc", "k2"]]]]
    rng.shuffle(first)
    return (execution_id, first), (f"{execution_id}/z", second)


def plan_workload(rng: random.Random, count: int, window_s: float, folder: str, lease_s: float, *,
                  with_async: bool = False) -> list[Admission]:
    """`count` executions of `chaos.mixed`, admitted over `window_s` seconds; `with_async`: about
    half of them (by a hash of the execution id, so that the plans the rng draws stay those of
    the same seed without it) run `chaos.mixed_async` instead, the same plan. About one in eight
    is half of a mailbox pair: a producer that puts an item and a consumer that takes it, admitted
    close together in either order (a consumer that comes first waits for the item). The put
    comes first in its plan: a producer whose retries run out later must not leave its consumer
    waiting for good. About one in fifty is half of a pair of colliders (`collider_plans`). One in
    `LIMITED_SHARE` of the `count` runs the same kinds of plan on a limited queue instead
    (`limited_admissions`), drawn from an rng of its own, and one in `MESSAGE_SHARE` takes
    messages (`message_admissions`), drawn from another."""
    admissions = []
    pair = 0
    i = 0
    limited = count // LIMITED_SHARE
    messages = count // MESSAGE_SHARE
    count -= limited + messages
    while i < count:
        at = window_s * i / count
        if i + 1 < count and rng.random() < 0.02:
            for eid, plan in collider_plans(rng, f"c{i:06d}"):
                admissions.append(Admission(eid, {"dir": folder, "plan": plan}, at + rng.uniform(0, 0.5)))
            i += 2
            continue
        plan = [_op(rng, n, lease_s, nested=False) for n in range(1, rng.randint(2, 5) + 1)]
        if i + 1 < count and rng.random() < 0.12:
            pair += 1
            other = [_op(rng, n, lease_s, nested=False) for n in range(1, rng.randint(1, 3) + 1)]
            put = [["put", "kp", pair]] + plan
            take = other[: rng.randint(0, len(other))] + [["take", "kt", pair]]
            first, second = (put, take) if rng.random() < 0.7 else (take, put)
            for j, p in ((i, first), (i + 1, second)):
                admissions.append(Admission(f"c{j:06d}", {"dir": folder, "plan": p}, at + rng.uniform(0, 0.5)))
            i += 2
            continue
        fail = rng.random() < 0.03
        admissions.append(Admission(f"c{i:06d}", {"dir": folder, "plan": plan, "fail": fail}, at))
        i += 1
    if with_async:
        admissions = [dataclasses.replace(a, workflow=MIXED_ASYNC) if zlib.crc32(a.execution_id.encode()) % 2 else a
                      for a in admissions]
    # Drawn last, from an rng of their own: the plans above stay those of the seed without them.
    queued = limited_admissions(random.Random(rng.getrandbits(64)), limited, window_s, folder, lease_s)
    messaged = message_admissions(random.Random(rng.getrandbits(64)), messages, window_s, folder)
    return sorted(admissions + queued + messaged, key=lambda a: a.at_s)


def message_admissions(rng: random.Random, count: int, window_s: float, folder: str) -> list[Admission]:
    """`count` executions of `chaos.messages` (`sender.message_input`), admitted over the first
    80% of the window: their messages follow them by up to about ten seconds."""
    return [Admission(f"m{n:06d}", message_input(rng, f"m{n:06d}", folder), round(rng.uniform(0, 0.8 * window_s), 3),
                      MESSAGES) for n in range(count)]


def limited_admissions(rng: random.Random, count: int, window_s: float, folder: str,
                       lease_s: float) -> list[Admission]:
    """`count` executions of the limited queues' workflows (`worker.apps.chaos`), in bursts
    of `BURST` into one queue at a time, each opening with a step long enough (0.3 to 0.7 s) that
    a burst saturates its queue's limit: the claims then have to hold executions back. Those of
    `chaos.keyed` draw their key from a few (`KEYS`), so each key has several at once."""
    admissions: list[Admission] = []
    workflows = sorted(LIMITED_QUEUES)
    burst = 0
    while len(admissions) < count:
        workflow = workflows[burst % len(workflows)]
        at = rng.uniform(0, window_s)
        for _ in range(min(rng.randint(*BURST), count - len(admissions))):
            n = len(admissions)
            plan = [["run", "k0", round(rng.uniform(0.3, 0.7), 3)]]
            plan += [_op(rng, i, lease_s, nested=True) for i in range(1, rng.randint(0, 2) + 1)]
            key = rng.choice(KEYS) if workflow == KEYED else None
            admissions.append(Admission(f"q{n:06d}", {"dir": folder, "plan": plan}, at + rng.uniform(0, 0.2),
                                        workflow, key))
        burst += 1
    return admissions


def app_workload(app: str, rng: random.Random, count: int, window_s: float) -> list[Admission]:
    """The workload an app of the user's defines (`chaos_workload(rng, count)`), admitted evenly
    over `window_s` seconds. The app is imported as a supervisor imports it (`worker._runtime.loading`)."""
    from worker._runtime.loading import is_app_path, load_app

    load_app(app)
    module = (sys.modules[os.path.splitext(os.path.basename(app))[0]] if is_app_path(app)
              else importlib.import_module(app))
    make = getattr(module, WORKLOAD_FUNCTION, None)
    if not callable(make):
        raise InvalidArgument(f"--app {app} defines no {WORKLOAD_FUNCTION}(rng, count) returning the (workflow,"
                              " input) pairs to admit")
    pairs = list(make(rng, count))
    if not pairs or not all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
        raise InvalidArgument(f"{app}: {WORKLOAD_FUNCTION}(rng, count) must return (workflow name, input) pairs,"
                              f" got {pairs[:3]!r}")
    return [Admission(f"u{i:06d}", value, window_s * i / len(pairs), workflow)
            for i, (workflow, value) in enumerate(pairs)]


class Admitter(threading.Thread):
    """Admits the workload on schedule, on a backend of its own (its owner closes it): a held
    write lock or a full disk stalls it, not the fault loop."""

    def __init__(self, backend, admissions: list[Admission], started: float):
        super().__init__(name="admitter", daemon=True)
        self.backend = backend
        self.admissions = admissions
        self.started = started
        self.admitted = 0
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            for a in self.admissions:
                if self.stop.wait(max(0.0, self.started + a.at_s - time.monotonic())):
                    return
                while True:
                    try:
                        self.backend.executions.admit(a.execution_id, a.workflow, json.dumps(a.input),
                                                      queue=a.queue, key=a.key)
                        break
                    except StorageError as exc:
                        if not exc.transient:
                            raise
                        if self.stop.wait(STORAGE_RETRY_S):
                            return
                self.admitted += 1
        except BaseException as exc:  # reported by the harness; the run then fails
            self.error = exc
