"""The order rule (SPEC section 11): a replay meets the recorded steps in the order they were recorded.

What the records say. The steps of an execution are read in write order (`get_with_steps`). A
step is placed by its *first* record (its later attempts do not move it). A record may carry a
`"group"`: the steps that overlapped when they ran (see below) share one, and every item of
`ctx.parallel(key, ...)` has one. The record sequence is cut into **blocks**: a run of
consecutive steps whose first records carry the same group is one block; a step with no group
(every sequential step, and every step recorded before groups existed) is a block of its own.

What the replay does. Every ctx call that records a step *reaches* its step key before it runs
anything or writes anything; blocks are *entered* in record order:

1. Reaching a recorded step of block j: if every block before j is entered, j is entered (a
   further step of an entered block is fine, in any order). If a block before j is not entered,
   the replay has **diverged**: "recorded step U was next, but the code reached K", U being the
   first step of the first block not entered.
2. Reaching a step with no record: fine when every block is entered (the replay is beyond its
   history, or inside the last block, a group the crash left partly recorded: the new step is
   written with that group, so that the next replay takes it for the group's too). Also fine
   when the first block not entered is the group named after this very step (the first step of a
   group to start names it, and a crash may have left it unrecorded): that block is entered.
   Otherwise **diverged**: the code reached a step the records do not have while recorded steps
   were still to come.
3. A `ctx.parallel` call reaches its item keys at once, and an external effect its key with its
   `#requested` step: as one step, placed at its last recorded member. Every block up to that
   one must be entered or be one of its members' (old records of a parallel call, with no group,
   are blocks of one item each).
4. When the workflow returns, or raises out, with a block not entered: **diverged**, "the
   workflow returned (raised) while recorded step U was not reached".

A diverged replay runs no step function and writes nothing for the step that diverged; the
delivery ends as `Suspended(diverged=detail)` (`ReplayDiverged`), and the ledger parks it.

Steps inside a block need not all be met: a replayed step does not call its function, so steps
started from inside it are never reached again, and a block is left behind as soon as a later
one is entered. So within a parallel group the rule sees only that the group was entered: a step
of a group renamed, added or removed while others of the group are recorded is not flagged.

Groups are written by the run (`worker.context`): a step takes off into the current *cluster*
of overlapping steps (a new one, named after it, when no step is in flight), and any record
written while steps are in flight (a step's, a timer's, a start's...) joins it. A cluster of
more than one step writes its name as the group of each of its records; a record is a member of
the cluster only while steps are in flight, so a cluster's records are consecutive. Items of
`ctx.parallel` start a cluster named after the call's key.

Cost: for a replay that keeps the order, each reach is one dict lookup and one comparison; a
first delivery (nothing recorded) pays one length test.
"""

from __future__ import annotations

import json
from typing import Iterable, Optional

# A recorded step's JSON holds this text only if it may hold a group: most records are never
# parsed here.
_GROUP_FIELD = '"group"'


class Order:
    """The blocks of an execution's records, and how far a replay entered them. Not thread-safe:
    the context calls it under its lock."""

    __slots__ = ("_block_of", "_groups", "_firsts", "_remaining", "_next")

    def __init__(self, recorded: Iterable) -> None:
        self._block_of: dict[str, int] = {}  # recorded step key -> its block
        self._groups: list[Optional[str]] = []  # each block's group (None: a sequential step)
        self._firsts: list[str] = []  # each block's first step key, for the detail
        self._remaining: list[int] = []  # each block's steps not reached yet
        self._next = 0  # the first block not entered
        block_of, groups = self._block_of, self._groups
        for record in recorded:  # in write order: a key's first record places it
            key = record.step_key
            if key in block_of:
                continue
            group = None
            text = record.step_response_json
            if _GROUP_FIELD in text:
                response = json.loads(text)
                group = response.get("group") if isinstance(response, dict) else None
            if group is None or not groups or groups[-1] != group:
                groups.append(group)
                self._firsts.append(key)
                self._remaining.append(0)
            block_of[key] = len(groups) - 1
            self._remaining[-1] += 1

    def recorded(self, key: str) -> bool:
        return key in self._block_of

    def beyond_history(self) -> bool:
        """Whether every block is entered: a step with no record reached now would not diverge."""
        return self._next == len(self._groups)

    def reach(self, key: str) -> tuple[Optional[str], Optional[str]]:
        """Step `key` is reached: `(detail, None)` if the replay diverged there, else
        `(None, group)`, `group` being the recorded group a step with no record joins."""
        block = self._block_of.get(key)
        if block is None:
            if self._next == len(self._groups):
                return None, self._open_group()
            if self._groups[self._next] == key:  # the group this step started, left unrecorded
                self._next += 1
                return None, key
            return self._diverged(key), None
        self._remaining[block] -= 1
        if block == self._next:
            self._next += 1
        elif block > self._next:
            return self._diverged(key), None
        return None, None

    def reach_together(self, keys: list[str], group: Optional[str]) -> Optional[str]:
        """The steps `keys` (a parallel call's items, an external effect and its request) are
        reached at once, as one step of group `group`. Returns the divergence detail, or None."""
        blocks = {self._block_of[key] for key in keys if key in self._block_of}
        if not blocks:  # none recorded: as one step with no record
            if not keys or self._next == len(self._groups):
                return None
            if group is not None and self._groups[self._next] == group:
                self._next += 1
                return None
            return self._diverged(keys[0])
        last = max(blocks)
        for block in range(self._next, last):
            if block not in blocks and (group is None or self._groups[block] != group):
                return self._diverged(keys[0])
        for key in keys:
            block = self._block_of.get(key)
            if block is not None:
                self._remaining[block] -= 1
        self._next = max(self._next, last + 1)
        return None

    def left_behind(self, how: str) -> Optional[str]:
        """The detail for a workflow that ended (`how`: "returned", "raised") with a recorded
        step not reached, or None."""
        if self._next == len(self._groups):
            return None
        return f"the workflow {how} while recorded step {self._firsts[self._next]!r} was not reached"

    def _open_group(self) -> Optional[str]:
        """The group a step with no record joins: the last block's, while steps of it are still
        to be reached (a group a crash left partly recorded)."""
        if self._groups and self._groups[-1] is not None and self._remaining[-1] > 0:
            return self._groups[-1]
        return None

    def _diverged(self, key: str) -> str:
        return f"recorded step {self._firsts[self._next]!r} was next, but the code reached {key!r}"
