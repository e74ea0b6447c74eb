"""Messages sent from outside during a chaos run (SPEC section 14): their plans, and the sender.

One execution in `MESSAGE_SHARE` of the built-in workload runs `chaos.messages`, which takes
2 to 6 messages on two topics with `ctx.recv`. Its input carries the harness's plan of sends
(`"sends"`), so the ledger alone says what was meant to arrive:

    [topic, message id, n, offset_s, repeat]   n numbers the execution's messages in send order;
                                               offset_s: seconds after its admission; repeat:
                                               a second send of an id already sent

About a third of the executions get their first message right after admission, before any
delivery could wait for it. About a third of the messages are sent twice with the same id,
later (most often after the first was taken); every repeat comes before the execution's last
message, so the execution cannot have completed when it is sent.

The `Sender` is a thread of the harness holding a `worker.Client` of its own, on the same
ledger target as the admitter (with `--hosts`, the server's Unix socket): an application that
talks to running workflows while supervisors are killed and frozen. It sends in time order, an
execution's messages once the admitter has admitted it, and retries a send that met a storage
error with the same id until it returns (a send whose commit was lost to a killed session, say,
is then answered from its id). Every attempt is one line of the message log
(`<folder>/messages.log`), fields separated by spaces:

    sent    <execution> <topic> <message id> <repeat 0|1> <time_ns>           the send returned
    error   <execution> <topic> <message id> <repeat 0|1> <time_ns> <type>    a storage error; retried
    refused <execution> <topic> <message id> <repeat 0|1> <time_ns> <type>    UnknownExecution or
                                                                              ExecutionConflict: given up

The checker (`message_checks`) reads the log beside the ledger's messages and steps.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Optional

from worker.apps.chaos import MESSAGES

from ..ledger.errors import ExecutionConflict, StorageError, UnknownExecution

MESSAGE_LOG = "messages.log"
MESSAGE_SHARE = 12  # one execution in this many takes messages
TOPICS = ("a", "b")
MESSAGES_PER_EXECUTION = (2, 6)
EARLY_SHARE = 0.35  # executions whose first message is sent right after admission
REPEAT_SHARE = 0.35  # messages sent a second time with the same id
RETRY_S = 0.05  # between attempts of a send that met a storage error


@dataclass(frozen=True)
class Send:
    """One send of the plan: at `at_s` seconds into the fault phase."""

    execution_id: str
    topic: str
    message_id: str
    n: int
    at_s: float
    repeat: bool
    order: float  # within the execution at the same moment: originals by n, a repeat just after its original

    @property
    def message(self) -> dict:
        """What is sent: the message names itself, so a recorded recv tells which one it took."""
        return {"id": self.message_id, "to": self.execution_id, "topic": self.topic, "n": self.n}


def message_input(rng: random.Random, execution_id: str, folder: str) -> dict:
    """The input of one `chaos.messages` execution: the topics its recvs wait on, in order, the
    step after each, and the sends planned for it."""
    count = rng.randint(*MESSAGES_PER_EXECUTION)
    topics = [rng.choice(TOPICS) for _ in range(count)]
    plan = [["run", f"h{i}", round(rng.uniform(0.02, 0.4), 3)] for i in range(1, count + 1)]
    sent_topics = topics[:]
    rng.shuffle(sent_topics)  # the sends interleave the topics otherwise than the recvs: some wait pending
    offset = 0.0 if rng.random() < EARLY_SHARE else rng.uniform(0.1, 3.0)
    sends = []
    for n, topic in enumerate(sent_topics, start=1):
        if n > 1:
            offset += rng.uniform(0.0, 1.2)
        sends.append([topic, f"{execution_id}.{n}", n, round(offset, 3), False])
    last = sends[-1][3]
    for topic, message_id, n, at, _ in sends[:-1]:
        if rng.random() < REPEAT_SHARE:
            sends.append([topic, message_id, n, round(rng.uniform(at, last), 3), True])
    return {"dir": folder, "topics": topics, "plan": plan, "sends": sends}


def planned_sends(admissions) -> list[Send]:
    """Every send of the `chaos.messages` admissions, in the order the sender makes them."""
    sends = []
    for a in admissions:
        if a.workflow != MESSAGES:
            continue
        for topic, message_id, n, offset, repeat in a.input["sends"]:
            sends.append(Send(a.execution_id, topic, message_id, n, a.at_s + offset, repeat,
                              n + 0.5 if repeat else n))
    return sorted(sends, key=lambda s: (s.at_s, s.execution_id, s.order))


class Sender(threading.Thread):
    """Sends the planned messages through a `worker.Client` of its own (see the module docstring);
    its owner sets `stop` and joins it. `error` holds what ended it otherwise."""

    def __init__(self, target, folder: str, admitter, started: float):
        super().__init__(name="sender", daemon=True)
        self.target = target
        self.admitter = admitter
        self.started = started
        self.sends = planned_sends(admitter.admissions)
        self.position = {a.execution_id: i for i, a in enumerate(admitter.admissions)}
        self.path = os.path.join(folder, MESSAGE_LOG)
        self.sent = 0
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        from worker.client import Client

        try:
            with Client(self.target, listen=False, create=False) as client, open(self.path, "a") as log:
                for send in self.sends:
                    if self.stop.wait(max(0.0, self.started + send.at_s - time.monotonic())):
                        return
                    while self.admitter.admitted <= self.position[send.execution_id]:
                        if self.stop.wait(RETRY_S):
                            return
                    if not self._send(client, log, send):
                        return
                    self.sent += 1
        except BaseException as exc:  # reported by the harness; the run then fails
            self.error = exc

    def _send(self, client, log, send: Send) -> bool:
        """Send until it returns or is refused; False if told to stop first."""
        while True:
            try:
                client.send(send.execution_id, send.message, topic=send.topic, id=send.message_id)
                self._log(log, "sent", send)
                return True
            except (UnknownExecution, ExecutionConflict) as exc:
                self._log(log, "refused", send, type(exc).__name__)
                return True
            except StorageError as exc:
                if not exc.transient:
                    raise
                self._log(log, "error", send, type(exc).__name__)
                if self.stop.wait(RETRY_S):
                    return False

    @staticmethod
    def _log(log, outcome: str, send: Send, detail: str = "") -> None:
        line = (f"{outcome} {send.execution_id} {send.topic} {send.message_id} {int(send.repeat)}"
                f" {time.time_ns()}" + (f" {detail}" if detail else ""))
        log.write(line + "\n")
        log.flush()
