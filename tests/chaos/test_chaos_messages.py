"""Messages under chaos: the workload's plan of sends (`supervisor.chaos.sender`), and the
checker's message invariants (`supervisor.chaos.message_checks`) on hand-made ledgers.

A `chaos.messages` execution is written through the real API (sends, takes under recv step keys,
step records, the completion) with the sender's log beside it; then the ledger is damaged the way
a broken runtime would have left it: a message held by two recv steps, one left untaken or never
stored, one missing from the result, messages out of order, a repeated send stored again, a send
refused. The sound ledger passes with its figures, and each damage is caught: a checker that
cannot fail proves nothing.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pytest

from supervisor import Completed
from supervisor.chaos import summary_lines
from supervisor.chaos.sender import MESSAGE_LOG, Send, planned_sends
from supervisor.chaos.workload import plan_workload
from test_chaos import LEASE, Ledger
from worker.apps.chaos import MESSAGES, STEP_LOG, digest

EID = "m1"
TOPICS = ["a", "b", "a"]  # the recvs, in order
# [topic, id, n, offset, repeat]: sent as a, b, a; message 1 sent again once it was taken
SENDS = [["a", f"{EID}.1", 1, 0.0, False], ["b", f"{EID}.2", 2, 0.1, False], ["a", f"{EID}.1", 1, 0.2, True],
         ["a", f"{EID}.3", 3, 0.3, False]]


@pytest.fixture
def ledger(tmp_path, clock, each_backend):
    """A hand-made ledger on each backend in turn."""
    made = Ledger(tmp_path, clock, each_backend)
    yield made
    made.backend.close()


def log_send(ledger: Ledger, outcome: str, topic: str, message_id: str, repeat: bool, detail: str = "") -> None:
    with open(os.path.join(ledger.folder, MESSAGE_LOG), "a") as f:
        f.write(f"{outcome} {EID} {topic} {message_id} {int(repeat)} {ledger.clock.now * 1_000_000}"
                + (f" {detail}" if detail else "") + "\n")


def send(ledger: Ledger, topic: str, message_id: str, n: int, repeat: bool) -> bool:
    """One send through the ledger, as the sender makes it and logs it; True if it stored the message."""
    message = Send(EID, topic, message_id, n, 0.0, repeat, n).message
    _, added = ledger.backend.messages.send(EID, json.dumps(message), topic=topic, message_id=message_id)
    log_send(ledger, "sent", topic, message_id, repeat)
    return added


def recv_and_handle(ledger: Ledger, lease, i: int, topic: str) -> tuple[str, dict]:
    """The i-th recv (a take under its step key, then its record) and the step after it."""
    key = f"@{i}:recv:{topic}"
    taken = ledger.backend.messages.take(lease, topic, step_key=key)
    message = json.loads(taken.message_json)
    ledger.step(lease, key, message)
    step = f"h{i}"
    value = {"token": lease.token, "pid": 4242, "nonce": f"n{i}", "message": message["id"]}
    ledger.log("begin", EID, lease.token, 4242, step, ledger.clock.now * 1_000_000)
    ledger.log("end", EID, lease.token, 4242, step, ledger.clock.now * 1_000_000, value["nonce"])
    ledger.step(lease, step, value)
    ledger.log("saw", EID, lease.token, 4242, step, ledger.clock.now * 1_000_000, digest(value))
    return message["id"], value


def sound_messages(ledger: Ledger) -> None:
    """Messages 1 and 2 sent before the execution's first delivery; 1 sent again after it was
    taken, which stores nothing; 3 sent last. The recvs take a:1, b:2, a:3, and it completes."""
    ledger.backend.executions.admit(EID, MESSAGES, json.dumps({
        "dir": ledger.folder, "topics": TOPICS, "plan": [["run", f"h{i}", 0] for i in (1, 2, 3)], "sends": SENDS}))
    assert send(ledger, "a", f"{EID}.1", 1, False) and send(ledger, "b", f"{EID}.2", 2, False)
    ledger.clock.advance(10)
    lease = ledger.claim()
    seen, received = {}, []
    for i, topic in enumerate(TOPICS, start=1):
        if i == 2:
            assert not send(ledger, "a", f"{EID}.1", 1, True)  # a repeat: answered from its id
            assert send(ledger, "a", f"{EID}.3", 3, False)
        message_id, value = recv_and_handle(ledger, lease, i, topic)
        seen[f"h{i}"] = digest(value)
        received.append([topic, message_id])
    result = {"token": lease.token, "seen": seen, "received": received}
    ledger.backend.executions.acknowledge(lease, Completed(json.dumps(result)))


def message_violations(ledger: Ledger) -> tuple[dict, dict, list]:
    result = ledger.check()
    kinds = {kind: n for kind, n in result.violation_counts.items() if kind.startswith("message_")}
    return kinds, result.figures["messages"], result


@pytest.mark.timeout(60)
def test_messages_taken_once_each_in_order_pass_with_their_figures(ledger):
    sound_messages(ledger)
    kinds, figures, result = message_violations(ledger)
    assert result.violations == [] and result.ok
    assert figures["executions"] == figures["completed"] == 1
    assert figures["planned"] == figures["stored"] == figures["taken"] == 3
    assert figures["sends_returned"] == 4 and figures["repeats_sent"] == 1 and figures["duplicates_refused"] == 1
    assert figures["sent_before_first_delivery"] == 2
    summary = " ".join(" ".join(summary_lines({"check": result.as_dict()})).split())
    assert "messages 3 of 3 sent to 1 executions in 4 sends (2 before the execution's first delivery), 3 taken," \
           " 1 duplicate sends refused by id" in summary and "without recording it; 0 violations" in summary


@pytest.mark.timeout(60)
def test_a_message_taken_by_a_delivery_that_died_before_recording_it_is_the_one_the_next_records(ledger):
    """Token 1 takes message 1 under its recv's key and dies before recording the step; token 2
    takes under the same key and gets the same message, though message 3 of the topic is pending."""
    ledger.backend.executions.admit(EID, MESSAGES, json.dumps({
        "dir": ledger.folder, "topics": TOPICS, "plan": [["run", f"h{i}", 0] for i in (1, 2, 3)], "sends": SENDS}))
    for topic, message_id, n, _, repeat in SENDS:
        send(ledger, topic, message_id, n, repeat)
    first = ledger.claim()
    assert json.loads(ledger.backend.messages.take(first, "a", step_key="@1:recv:a").message_json)["id"] == f"{EID}.1"
    ledger.clock.advance(LEASE + 5_000)  # its worker was killed: the lease expires, unrecorded
    second = ledger.claim()
    seen, received = {}, []
    for i, topic in enumerate(TOPICS, start=1):
        message_id, value = recv_and_handle(ledger, second, i, topic)
        seen[f"h{i}"] = digest(value)
        received.append([topic, message_id])
    assert received == [["a", f"{EID}.1"], ["b", f"{EID}.2"], ["a", f"{EID}.3"]]
    ledger.backend.executions.acknowledge(second, Completed(json.dumps({"token": 2, "seen": seen,
                                                                        "received": received})))
    kinds, figures, result = message_violations(ledger)
    assert result.violations == [], result.violations
    assert figures["taken_by_a_delivery_that_died"] == 1 and figures["taken"] == 3


@pytest.mark.timeout(60)
def test_a_message_held_by_two_recv_steps_is_caught(ledger):
    sound_messages(ledger)
    # The third recv holds the first's message, as a take that ignored the step's receipt would.
    ledger.sql("UPDATE steps SET step_response_json = (SELECT step_response_json FROM steps WHERE execution_id = $p"
               " AND step_key = '@1:recv:a') WHERE execution_id = $p AND step_key = '@3:recv:a'", EID, EID)
    kinds, _, result = message_violations(ledger)
    assert kinds.get("message_taken_twice") == 1, result.violations
    (violation,) = [v for v in result.violations if v.kind == "message_taken_twice"]
    assert f"message {EID}.1" in violation.detail and "2 recv steps" in violation.detail
    summary = summary_lines({"check": result.as_dict()})
    assert any(line.startswith("  FAIL  messages: none lost, none taken twice") for line in summary), summary


@pytest.mark.timeout(60)
def test_a_message_held_by_a_recv_of_two_executions_is_caught(ledger):
    sound_messages(ledger)
    # Another execution's recv recorded m1's first message, as a take that ignored whose it was would.
    ledger.backend.executions.admit("m2", MESSAGES, json.dumps({
        "dir": ledger.folder, "topics": ["a"], "plan": [["run", "h1", 0]], "sends": []}))
    other = ledger.claim()
    ledger.step(other, "@1:recv:a", Send(EID, "a", f"{EID}.1", 1, 0.0, False, 1).message)
    kinds, _, result = message_violations(ledger)
    assert kinds.get("message_taken_twice") == 1, result.violations
    assert any("('m1', '@1:recv:a'), ('m2', '@1:recv:a')" in v.detail for v in result.violations)


@pytest.mark.timeout(60)
def test_a_message_of_another_execution_held_by_a_recv_is_caught(ledger):
    sound_messages(ledger)
    other = json.dumps({"value": {"id": "m9.1", "to": "m9", "topic": "a", "n": 1}})
    ledger.sql("UPDATE steps SET step_response_json = $p WHERE execution_id = $p AND step_key = '@3:recv:a'",
               other, EID)
    kinds, _, _ = message_violations(ledger)
    assert kinds.get("message_mismatch", 0) >= 1 and "message_lost" not in kinds


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage, message_id, detail", [
    ("UPDATE messages SET taken_step = NULL, taken_at = NULL WHERE execution_id = $p AND message_id = $p", "2",
     "untaken, yet the execution completed"),
    ("DELETE FROM messages WHERE execution_id = $p AND message_id = $p", "3", "send of it returned"),
], ids=["left untaken by a completed execution", "sent but not stored"])
def test_a_lost_message_is_caught(ledger, damage, message_id, detail):
    sound_messages(ledger)
    ledger.sql(damage, EID, f"{EID}.{message_id}")
    kinds, _, result = message_violations(ledger)
    assert kinds.get("message_lost") == 1, result.violations
    assert any(detail in v.detail for v in result.violations)


@pytest.mark.timeout(60)
def test_a_completed_result_that_lacks_a_message_is_caught(chaos_ledger):
    sound_messages(chaos_ledger)
    chaos_ledger.sql("UPDATE executions SET result_json = json_remove(result_json, '$$.received[2]')"
                     " WHERE execution_id = $p", EID)
    kinds, _, result = message_violations(chaos_ledger)
    assert kinds.get("message_lost") == 1 and kinds.get("message_mismatch") == 1, result.violations


@pytest.mark.timeout(60)
def test_messages_of_a_topic_taken_out_of_send_order_are_caught(ledger):
    sound_messages(ledger)
    # Messages 1 and 3 (topic a) swap places in the execution's order.
    ledger.sql("UPDATE messages SET seq = 4 - seq WHERE execution_id = $p AND message_id IN ($p, $p)",
               EID, f"{EID}.1", f"{EID}.3")
    kinds, _, result = message_violations(ledger)
    assert kinds == {"message_order": 2}, result.violations  # stored out of send order, taken out of seq order


@pytest.mark.timeout(60)
def test_a_repeated_send_stored_again_is_caught(ledger):
    sound_messages(ledger)
    # Message 1 stored a second time, under another id, as a send that ignored the id could.
    ledger.sql("INSERT INTO messages (execution_id, message_id, topic, seq, message_json, sent_at, taken_step,"
               " taken_at) SELECT execution_id, 'again', topic, 9, message_json, sent_at, NULL, NULL FROM messages"
               " WHERE execution_id = $p AND message_id = $p", EID, f"{EID}.1")
    kinds, _, result = message_violations(ledger)
    assert kinds.get("message_stored_twice", 0) >= 1, result.violations
    assert any(f"message {EID}.1 is stored as" in v.detail for v in result.violations)


@pytest.mark.timeout(60)
def test_a_refused_send_is_caught_unless_a_storage_error_came_before_it(chaos_ledger):
    sound_messages(chaos_ledger)
    log_send(chaos_ledger, "refused", "a", f"{EID}.3", True, "ExecutionConflict")
    kinds, _, _ = message_violations(chaos_ledger)
    assert kinds == {"message_refused": 1}
    os.remove(os.path.join(chaos_ledger.folder, MESSAGE_LOG))
    log_send(chaos_ledger, "sent", "a", f"{EID}.1", False)
    log_send(chaos_ledger, "sent", "b", f"{EID}.2", False)
    log_send(chaos_ledger, "error", "a", f"{EID}.3", False, "StorageUnavailable")  # its commit's answer was lost
    log_send(chaos_ledger, "refused", "a", f"{EID}.3", False, "ExecutionConflict")  # the execution had completed
    kinds, figures, _ = message_violations(chaos_ledger)
    assert kinds == {} and figures["storage_errors_retried"] == 1
    assert os.path.exists(os.path.join(chaos_ledger.folder, STEP_LOG))


# -- the plan of sends -----------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_one_execution_in_twelve_takes_messages_and_its_last_send_is_new(tmp_path):
    drawn = plan_workload(random.Random(5), 600, 60.0, str(tmp_path), 1.5)
    assert plan_workload(random.Random(5), 600, 60.0, str(tmp_path), 1.5) == drawn
    takers = [a for a in drawn if a.workflow == MESSAGES]
    assert len(drawn) == 600 and len(takers) == 50 and all(a.at_s <= 48.0 for a in takers)
    sends = planned_sends(drawn)
    early = repeats = 0
    for a in takers:
        mine = [s for s in sends if s.execution_id == a.execution_id]
        originals = [s for s in mine if not s.repeat]
        # What it waits for is what is sent: per topic as many, each id once, in n order.
        assert Counter(s.topic for s in originals) == Counter(a.input["topics"])
        assert [s.n for s in originals] == list(range(1, len(originals) + 1))
        assert len(a.input["plan"]) == len(a.input["topics"])
        # The last send is a new message: no repeat can find the execution completed.
        assert not mine[-1].repeat and mine[-1].n == len(originals)
        assert all(s.message_id in {o.message_id for o in originals[:-1]} for s in mine if s.repeat)
        assert all(mine.index(s) > next(i for i, o in enumerate(mine) if o.message_id == s.message_id)
                   for s in mine if s.repeat)
        early += mine[0].at_s == a.at_s
        repeats += sum(s.repeat for s in mine)
    assert 8 <= early <= 30 and repeats >= 20
