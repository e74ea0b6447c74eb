"""The order rule (SPEC section 11): a replay meets the recorded steps in the order they were recorded.

What the records say. The steps of an execution are read in write order (`get_with_steps`). A
step is placed by its *first* record (its later attempts do not move it). A record may carry a
`"group"`: the steps that overlapped when they ran share one (see below), and so do the items
of one `ctx.parallel(key, ...)` call. A record may also carry `"within"`: the step whose function
it was started from (a nested step). The record sequence is cut into **blocks**: a run of
consecutive steps whose first records carry the same group is one block; a step with no group
(every sequential step, and every step recorded before groups existed) is a block of its own.

What the replay does. Every ctx call that records a step *reaches* its step key before it runs
anything or writes anything. Reaching a recorded step *enters* its block; the blocks entered are
a prefix of the records, then the first block not entered (the *next* one):

1. A recorded step keeps the order when every block before its own is entered once it is: a step
   of the next block, or of a block entered already (the steps of a block in any order).
2. A step with no record keeps the order when every block is entered (the replay is beyond its
   history), or when the next block is the group named after this very step (the first step of
   a group to start names it, and a crash may have left it unrecorded): that block is entered.
   Reached while the last block's group still has steps not reached (a crash left the group
   partly recorded), it joins that group: its record carries the group's name.
3. A `ctx.parallel` call reaches its item keys at once, and an external effect its key with its
   `#requested` step, as one step; it keeps the order when every block up to its last recorded
   member's is entered once its members' are (blocks of its own group may be passed over).
4. When the workflow returns, or raises out, every block must be entered.

A step that breaks 1-3, or an end that breaks 4, has **diverged**: "recorded step U was next,
but the code reached K" (U the first step of the next block), or "the workflow returned (raised)
while recorded step U was not reached". No step function runs and nothing is written for it; the
delivery ends as `Suspended(diverged=detail)` (`ReplayDiverged`) and the ledger parks it.

Async workflows: steps started together. In an `async def` workflow, `ctx.run` (and
`ctx.effect`) that would diverge first lets the workflow's other tasks run until none reaches a
new step (`AsyncWorkflowContext._settle_order`), then decides again: the steps of an
`asyncio.gather` reach their keys within one pass of the event loop, so a gather recorded before
groups existed (its records in the order its steps ended) replays, while sequential code that
took another order still diverges. Nothing of the waiting step runs or is written meanwhile.

Nested steps (`"within"`) are never waited for: a replayed step does not call its function, so
the steps started inside it are never reached again. They do not keep a group open either.

What the rule cannot see, by design (a replay of unchanged code must never be parked, and a
crash may leave any part of a group unrecorded): inside a group, only that it was entered. A step
of a group added, removed or renamed while other steps of the group are recorded is not flagged
when the group is the last block of the records (its later steps not recorded yet); the new step
runs. After a group, the next recorded block must still be met: a renamed step of a group that
is not the last block is flagged, since a crash cannot leave a step unrecorded there.

Groups are written by the run (`worker.context`): a step takes off into the current *cluster*
of overlapping steps (a new one, named after it, when no step is in flight), and any record
written while steps are in flight (a step's, a timer's, a start's...) joins it. A cluster of
more than one step writes its name as the group of each of its records; a record joins a cluster
only while steps are in flight, so a cluster's records are consecutive. The items of
`ctx.parallel` start a cluster named after the call's key.

Cost: for a replay that keeps the order, each reach is two dict lookups and a few list updates;
a first delivery (nothing recorded) pays one comparison.
"""

from __future__ import annotations

import json
from typing import Iterable, Optional

# A recorded step's JSON holds these texts only if it may hold the fields: most records are
# never parsed here.
_GROUP_FIELD = '"group"'
_WITHIN_FIELD = '"within"'
_IN_ORDER = (None, None)


class Order:
    """The blocks of an execution's records, and how far a replay entered them. Not thread-safe:
    the context calls it under its lock."""

    __slots__ = ("_block_of", "_groups", "_firsts", "_entered", "_nested", "_reached", "_next", "_others", "_last")

    def __init__(self, recorded: Iterable) -> None:
        self._block_of: dict[str, int] = {}  # recorded step key -> its block
        self._groups: list[Optional[str]] = []  # each block's group (None: a sequential step)
        self._firsts: list[str] = []  # each block's first step key
        self._nested: set[str] = set()  # recorded steps started inside another step's function
        self._reached: set[str] = set()  # the steps of the last block reached, when it is a group
        self._next = 0  # the first block not entered
        self._others = 0  # other reaches: progress, with `_next` and `_reached`
        self._last: Optional[list[str]] = None  # the last block's steps, once asked for
        block_of, groups, firsts = self._block_of, self._groups, self._firsts
        group = previous = None
        for record in recorded:  # in write order: a key's first record places it
            key = record.step_key
            if key in block_of:
                continue
            text = record.step_response_json
            if _GROUP_FIELD in text or _WITHIN_FIELD in text:
                response = json.loads(text)
                if isinstance(response, dict):
                    group = response.get("group")
                    if response.get("within") is not None:
                        self._nested.add(key)
            if group is None or group != previous:
                groups.append(group)
                firsts.append(key)
            block_of[key] = len(firsts) - 1
            previous, group = group, None
        self._entered = [False] * len(groups)

    @property
    def reaches(self) -> int:
        """How many reaches there were: progress, for `AsyncWorkflowContext._settle_order`."""
        return self._next + len(self._reached) + self._others

    def recorded(self, key: str) -> bool:
        return key in self._block_of

    def beyond_history(self) -> bool:
        """Whether every block is entered: a step with no record reached now would not diverge."""
        return self._next == len(self._groups)

    def reach(self, key: str) -> tuple[Optional[str], Optional[str]]:
        """Step `key` is reached: `(detail, group)`, `detail` saying how the replay diverged
        there (None if it did not), `group` the recorded group a step with no record joins."""
        block = self._block_of.get(key)
        if block is None:
            self._others += 1
            if self._next < len(self._groups) and self._groups[self._next] == key:
                self._enter(self._next)  # the group this step started, left unrecorded by a crash
            return self.verdict(key), self.open_group()
        if block == len(self._groups) - 1 and self._groups[block] is not None:
            self._reached.add(key)
        if block == self._next:  # the common case: the next block, in order
            entered = self._entered
            entered[block] = True
            block += 1
            while block < len(entered) and entered[block]:
                block += 1
            self._next = block
            return _IN_ORDER
        if block < self._next:
            return _IN_ORDER
        self._entered[block] = True
        return self._diverged(key), None

    def reach_together(self, keys: list[str], group: Optional[str]) -> Optional[str]:
        """The steps `keys` are reached at once, as one step of group `group`. Returns the
        divergence detail, or None."""
        self._others += 1
        blocks = {self._block_of[key] for key in keys if key in self._block_of}
        if not blocks:  # none recorded: as one step with no record
            if not keys or self._next == len(self._groups):
                return None
            if group is not None and self._groups[self._next] == group:
                self._enter(self._next)
                return None
            return self._diverged(keys[0])
        last = max(blocks)
        for block in range(self._next, last):
            if block not in blocks and (group is None or self._groups[block] != group):
                return self._diverged(keys[0])
        self._reached.update(key for key in keys if self._block_of.get(key) == len(self._groups) - 1)
        for block in range(self._next, last + 1):
            self._entered[block] = True
        self._enter(last)
        return None

    def verdict(self, key: str) -> Optional[str]:
        """Whether step `key`, reached already, keeps the order now: the detail if it does not."""
        block = self._block_of.get(key)
        if block is None:
            return None if self._next == len(self._groups) else self._diverged(key)
        return None if block < self._next else self._diverged(key)

    def left_behind(self, how: str) -> Optional[str]:
        """The detail for a workflow that ended (`how`: "returned", "raised") with a recorded
        block not entered, or None."""
        if self._next == len(self._groups):
            return None
        return f"the workflow {how} while recorded step {self._firsts[self._next]!r} was not reached"

    def _enter(self, block: int) -> None:
        entered = self._entered
        entered[block] = True
        n = len(entered)
        while self._next < n and entered[self._next]:
            self._next += 1

    def open_group(self) -> Optional[str]:
        """The group a step with no record joins: the last block's, while steps of it are still
        to be reached (a group a crash left partly recorded)."""
        if self._groups and self._groups[-1] is not None and self._next == len(self._groups) and self._unreached():
            return self._groups[-1]
        return None

    def _unreached(self) -> list[str]:
        """The steps of the last block not reached yet, nested ones aside."""
        if self._last is None:
            last = len(self._groups) - 1
            self._last = [key for key, block in self._block_of.items() if block == last]
        return [key for key in self._last if key not in self._reached and key not in self._nested]

    def _diverged(self, key: str) -> str:
        return f"recorded step {self._firsts[self._next]!r} was next, but the code reached {key!r}"
