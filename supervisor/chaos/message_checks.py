"""The message invariants (SPEC section 14): no message lost or taken twice, whatever the faults.

Read from the ledger (the `messages` table: what was stored and which step took each; the recv
steps' records; the `chaos.messages` executions' inputs and results) and from the sender's log
(`sender`). Each message names itself (`{"id", "to", "topic", "n"}`), so a recorded recv says
which message it took without the messages table's help. For each `chaos.messages` execution:

    message_stored_twice  a stored message whose own id is not its message id, or one id stored in
                          two rows: a repeated send stored again; a message stored that was never
                          planned
    message_lost          a planned message that the sender's log says was sent (or that the
                          completed execution needed) is not stored; a completed execution left a
                          stored message untaken, or its result lacks one
    message_taken_twice   two recv steps (of one execution or of two) hold the same message; a
                          result lists one twice
    message_mismatch      a recv step holds a message the ledger does not mark taken by it (or
                          one not stored for its execution); the recv records, in order, differ
                          from what the result says was received; the step after a recv recorded
                          another message's id
    message_order         on one topic, messages stored out of send order (`n`), or taken out of
                          their stored order (`seq`)
    message_refused       a send refused (`UnknownExecution`, `ExecutionConflict`) that was not a
                          retry, after a storage error, of a send that may have been stored

A recv is an unnamed step keyed `@<n>:recv:<topic>` (`worker.messages`), n its place among the
execution's unnamed steps: the recvs are the only unnamed steps of `chaos.messages`, so n orders
them. A repeat that `send` answered from its id, without storing, is counted from the log: every
send that returned, less one per id stored.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import Callable, Optional

from worker.apps.chaos import MESSAGES

from .clocks import Clocks
from .evidence import SendLine
from .recorded import value_of

RECV_KEY = re.compile(r"^@(\d+):recv:(.+)$")
ACKNOWLEDGED = "acknowledged"


def check_messages(executions: dict, rows: list, recorded: dict, history: dict, sends: Optional[list[SendLine]],
                   clocks: Clocks, violate: Callable[[str, Optional[str], str], None]) -> dict:
    """Check every `chaos.messages` execution's messages; return the figures.

    Args:
        executions: {execution id: executions row (execution_id, workflow, input_json, status,
            token, lease_expires_at, result_json, ...)}.
        rows: the `messages` table's rows (execution_id, message_id, topic, seq, message_json,
            sent_at, taken_step, taken_at).
        recorded: {(execution id, step key): the done step row (.., step_response_json at 5, token at 6)}.
        history: {execution id: lease history rows, by token}.
        sends: the sender's log, or None without a work folder.
    """
    stored: dict[str, dict[str, tuple]] = defaultdict(dict)
    by_own_id: dict[tuple, list] = defaultdict(list)
    for row in rows:
        stored[row[0]][row[1]] = row
        by_own_id[(row[0], _body(row[4]).get("id"))].append(row[1])
    holders: dict[tuple, list] = defaultdict(list)  # (to, message id) -> [(execution, recv key), ...]
    recvs: dict[str, list] = defaultdict(list)  # execution -> [(n, key, topic, message), ...]
    for (eid, key), row in recorded.items():
        found = RECV_KEY.match(key)
        if found is None or executions.get(eid, (None, None))[1] != MESSAGES:
            continue  # another workflow's messages need not name themselves
        ok, message = value_of(row[5])
        message = message if ok and isinstance(message, dict) else {}
        recvs[eid].append((int(found.group(1)), key, found.group(2), message, row[6]))
        if message.get("id") is not None:
            holders[(message.get("to"), message["id"])].append((eid, key))
    log = _by_message(sends or [])
    figures = Counter()
    for eid, row in executions.items():
        if row[1] != MESSAGES:
            continue
        figures["executions"] += 1
        figures["completed"] += row[3] == "completed"
        planned = json.loads(row[2])
        ids = {message_id: (topic, n) for topic, message_id, n, _, _ in planned.get("sends", [])}
        figures["planned"] += len(ids)
        mine = stored.get(eid, {})
        figures["stored"] += len(mine)
        figures["taken"] += sum(1 for r in mine.values() if r[6] is not None)
        _check_stored(eid, mine, ids, by_own_id, log, row[3] == "completed", violate)
        taken = sorted(recvs.get(eid, []))
        _check_recvs(eid, taken, mine, holders, violate)
        if row[3] == "completed":
            _check_result(eid, row, taken, mine, ids, recorded, violate)
        _check_order(eid, mine, taken, violate)
        figures["sent_before_first_delivery"] += _sent_before_first_claim(mine, history.get(eid, []), clocks)
        figures["taken_by_a_delivery_that_died"] += _taken_then_lost(mine, taken, history.get(eid, []))
        figures["recorded_by_a_lost_delivery"] += sum(
            1 for *_, token in taken if _ended(history.get(eid, []), token) not in (ACKNOWLEDGED, None))
    for (to, message_id), steps in holders.items():
        if len(steps) > 1:
            violate("message_taken_twice", to, f"message {message_id} to {to} is held by {len(steps)} recv steps:"
                    f" {sorted(steps)[:6]}")
    for (eid, message_id), entries in log.items():
        outcomes = [line.outcome for line in entries]
        if "refused" in outcomes and "error" not in outcomes[:outcomes.index("refused")]:
            refused = entries[outcomes.index("refused")]
            violate("message_refused", eid, f"the send of message {message_id} was refused ({refused.detail})"
                    " with no storage error before it")
    returned = {key: sum(1 for line in entries if line.outcome == "sent") for key, entries in log.items()}
    found = dict(figures)
    found.update({
        "send_attempts": sum(len(entries) for entries in log.values()),
        "sends_returned": sum(returned.values()),
        "repeats_sent": sum(1 for entries in log.values() for line in entries
                            if line.outcome == "sent" and line.repeat),
        # Every send of a stored id that returned, but the one that stored it, was answered from its id.
        "duplicates_refused": sum(n - 1 for (eid, message_id), n in returned.items()
                                  if n > 1 and message_id in stored.get(eid, {})),
        "storage_errors_retried": sum(1 for entries in log.values() for line in entries if line.outcome == "error"),
    })
    return found


def _body(message_json: str) -> dict:
    try:
        body = json.loads(message_json)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _by_message(sends: list[SendLine]) -> dict[tuple, list[SendLine]]:
    log: dict[tuple, list] = defaultdict(list)
    for line in sends:
        log[(line.execution_id, line.message_id)].append(line)
    return log


def _check_stored(eid: str, mine: dict, ids: dict, by_own_id: dict, log: dict, completed: bool, violate) -> None:
    for message_id, row in mine.items():
        own = _body(row[4]).get("id")
        if own != message_id or len(by_own_id[(eid, own)]) > 1:
            violate("message_stored_twice", eid, f"message {own} is stored as {sorted(by_own_id[(eid, own)])}")
        elif message_id not in ids:
            violate("message_stored_twice", eid, f"message {message_id} was stored but never planned")
        if completed and row[6] is None:
            violate("message_lost", eid, f"message {message_id} (topic {row[2]}, seq {row[3]}, sent at {row[5]}) is"
                    " untaken, yet the execution completed")
    for message_id in ids:
        if message_id in mine:
            continue
        sent = any(line.outcome == "sent" for line in log.get((eid, message_id), []))
        if sent or completed:
            violate("message_lost", eid, f"message {message_id} is not stored, yet "
                    + ("the sender's send of it returned" if sent else "the execution completed"))


def _check_recvs(eid: str, taken: list, mine: dict, holders: dict, violate) -> None:
    for _, key, topic, message, _ in taken:
        message_id = message.get("id")
        row = mine.get(message_id)
        if message.get("to") != eid or row is None:
            violate("message_mismatch", eid, f"recv {key} holds {message}, which is no message stored for this"
                    " execution")
        elif row[6] != key and len(holders[(eid, message_id)]) == 1:  # two holders: taken twice, said once
            violate("message_mismatch", eid, f"recv {key} holds message {message_id}, which the ledger marks"
                    f" taken by {row[6]!r}")
        elif row[2] != topic:
            violate("message_mismatch", eid, f"recv {key} on topic {topic} holds message {message_id} of topic"
                    f" {row[2]}")


def _check_result(eid: str, row: tuple, taken: list, mine: dict, ids: dict, recorded: dict, violate) -> None:
    result = json.loads(row[6]) if row[6] else {}
    received = result.get("received") if isinstance(result, dict) else None
    if not isinstance(received, list):
        violate("message_lost", eid, f"the result lists no messages received: {str(result)[:120]}")
        return
    names = [entry[1] for entry in received if isinstance(entry, list) and len(entry) == 2]
    for message_id, n in Counter(names).items():
        if n > 1:
            violate("message_taken_twice", eid, f"the result lists message {message_id} {n} times")
    for message_id in sorted(set(ids) - set(names)):
        violate("message_lost", eid, f"message {message_id} is missing from the completed execution's result")
    recorded_order = [[topic, message.get("id")] for _, _, topic, message, _ in taken]
    if recorded_order != received:
        violate("message_mismatch", eid, f"the result received {received}; the recv steps record {recorded_order}")
    plan = json.loads(row[2]).get("plan", [])
    for (_, message_id), (_, key, _) in zip(received, plan):
        step = recorded.get((eid, key))
        ok, value = value_of(step[5]) if step is not None else (False, None)
        if not ok or not isinstance(value, dict) or value.get("message") != message_id:
            violate("message_mismatch", eid, f"step {key} after the recv of {message_id} recorded"
                    f" {value.get('message') if isinstance(value, dict) else value}")


def _check_order(eid: str, mine: dict, taken: list, violate) -> None:
    by_topic: dict[str, list] = defaultdict(list)
    for row in mine.values():
        by_topic[row[2]].append(row)
    for topic, rows in by_topic.items():
        order = [_body(r[4]).get("n") for r in sorted(rows, key=lambda r: r[3])]
        if order != sorted(order, key=lambda n: (n is None, n)):
            violate("message_order", eid, f"topic {topic}: stored in the order n = {order}, not as sent")
    seqs: dict[str, list] = defaultdict(list)
    for _, _, topic, message, _ in taken:
        row = mine.get(message.get("id"))
        if row is not None:
            seqs[topic].append(row[3])
    for topic, found in seqs.items():
        if found != sorted(found):
            violate("message_order", eid, f"topic {topic}: taken in the order seq = {found}")


def _ended(history: list, token: int) -> Optional[str]:
    """How delivery `token` ended ("acknowledged", "superseded", ...); None if unknown or open."""
    if 1 <= token <= len(history) and history[token - 1][1] == token:
        return history[token - 1][6]
    return None


def _sent_before_first_claim(mine: dict, history: list, clocks: Clocks) -> int:
    """Messages sent (by the sender's clock, unskewed) before the execution's first claim."""
    if not history:
        return len(mine)
    first = clocks.true_ms(history[0][2], history[0][3])
    return sum(1 for row in mine.values() if row[5] < first)


def _taken_then_lost(mine: dict, taken: list, history: list) -> int:
    """Messages taken by one delivery and recorded by a later one: the delivery that took the
    message died between its take and its record, and the next got the same message by its key.
    Told by a take before the recording delivery's claim, both by that delivery's clock: a take
    of its own is never earlier. (A taker whose clock ran ahead of it by more than the gap is
    missed: the figure is a floor.)"""
    count = 0
    for _, _, _, message, token in taken:
        row = mine.get(message.get("id"))
        if row is not None and row[7] is not None and 1 <= token <= len(history) and row[7] < history[token - 1][3]:
            count += 1
    return count
