"""The `failed_by_infrastructure` check: every failure of a chaos run is one its workload plans.

A storage error inside a delivery (a full disk, a busy database, an I/O error) must cost time,
never an outcome: it ends the delivery as a retry, and the execution completes once the fault
clears. So every failed execution's error must be one `worker.apps.chaos` fails with on purpose:
a `ChaosFailure` whose message (less its closing `(token N)`) is either

- `deliberate failure`, and its input asks for one (`"fail": true`); or
- the message of a step of its plan that failed for good, quoting that step's recorded error,
  which must itself be planned: a flaky step's `RetryableError` (`flaky step KEY (token N)`),
  or, for a child's `.wait`, the child's own error, the child's failure being planned in turn.

Every step error recorded in the ledger must be planned in the same way (an effect, a store
update, a timer or a plain step never fails on purpose), and no error, of any workflow, may
name the storage: sqlite, disk, database, locked, storage, I/O error, malformed, or the name of
a `StorageError` class (`STORAGE_ERRORS`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from worker.apps.chaos import LIMITED_QUEUES, MESSAGES, MIXED, MIXED_ASYNC

from ..ledger import errors
from .recorded import RecordedValues, value_of

CHAOS_WORKFLOWS = (MIXED, MIXED_ASYNC, *LIMITED_QUEUES, MESSAGES)  # the built-in workload's: same plans, same evidence
TOKEN_IN_ERROR = re.compile(r"\(token (\d+)\)\s*$")
# What an error that came from the storage, not from the workflow, names.
STORAGE_ERRORS = sorted(cls.__name__ for cls in vars(errors).values()
                        if isinstance(cls, type) and issubclass(cls, errors.StorageError))
INFRASTRUCTURE = re.compile("|".join(["sqlite", "disk", "database", "locked", "storage", r"i/o error", "malformed",
                                      "operationalerror"] + [name.lower() for name in STORAGE_ERRORS]), re.I)


class FailureChecks(RecordedValues):
    """Run by a `Checker`, on the executions, plans, steps and recorded values it loaded."""

    def _check_failures(self) -> None:
        """Every failure is one the workload plans; none came from the storage."""
        failed = planned = 0
        for eid, row in self.executions.items():
            if row[3] != "failed":
                continue
            failed += 1
            try:
                error = json.loads(row[7])
            except (TypeError, ValueError):
                error = row[7]
            why = self._unplanned_failure(eid, error) if row[1] in CHAOS_WORKFLOWS else _names_storage(error)
            if why is None:
                planned += 1
            else:
                self.result.violate("failed_by_infrastructure", eid, f"failed with {_brief(error)}: {why}")
        step_errors = 0
        for eid, steps in self.steps.items():
            plan = self.plans.get(eid)
            for _, _, key, attempt, _, response, _, _ in steps:
                ok, error = value_of(response)
                if ok:
                    continue
                step_errors += 1
                why = self._unplanned_step_error(eid, key, error) if plan is not None else _names_storage(error)
                if why is not None:
                    self.result.violate("failed_by_infrastructure", eid, f"step {key} attempt {attempt} recorded"
                                        f" {_brief(error)}: {why}")
        self.result.figures["failures"] = {"failed": failed, "planned": planned, "step_errors": step_errors}

    def _unplanned_failure(self, eid: str, error: Any) -> Optional[str]:
        """None if `error`, the outcome of chaos execution `eid`, is one its plan leads to; else why not."""
        why = _names_storage(error)
        if why is not None:
            return why
        if error.get("type") != "ChaosFailure":
            return f"the workload never fails with {error.get('type')}"
        body = TOKEN_IN_ERROR.sub("", str(error.get("message", ""))).strip()
        if body == "deliberate failure":
            wanted = json.loads(self.executions[eid][2]).get("fail")
            return None if wanted else "a deliberate failure its input does not ask for"
        for key in self.plans.get(eid, {}):
            row = self.recorded.get((eid, key))
            if row is None:
                continue
            ok, step_error = value_of(row[5])
            if ok or not isinstance(step_error, dict) or not step_error.get("message"):
                continue
            if step_error["message"] in body and self._unplanned_step_error(eid, key, step_error) is None:
                return None
        return "no planned step failure of its plan explains it"

    def _unplanned_step_error(self, eid: str, key: str, error: Any) -> Optional[str]:
        why = _names_storage(error)
        if why is not None:
            return why
        op = self.plans.get(eid, {}).get(key)
        kind = op[0] if op else None
        if kind == "retry":
            if error.get("type") == "RetryableError" and \
                    re.fullmatch(rf"flaky step {re.escape(key)} \(token \d+\)", str(error.get("message"))):
                return None
            return "a flaky step fails only with its RetryableError"
        if kind == "wait":
            child = self._recorded_value(eid, op[2])
            target = self.executions.get(child) if isinstance(child, str) else None
            if target is None or target[3] != "failed":
                return f"child {child} did not fail"
            child_error = json.loads(target[7])
            if not isinstance(child_error, dict) or (child_error.get("type"), child_error.get("message")) != \
                    (error.get("type"), error.get("message")):
                return f"child {child} failed with {_brief(child_error)}"
            return self._unplanned_failure(child, child_error)
        return f"a {kind or 'step not in the plan'} step never fails on purpose"


def _names_storage(error: Any) -> Optional[str]:
    """Why `error` is an infrastructure error, if it is one (or is not an error object at all)."""
    if not isinstance(error, dict):
        return f"the error {error!r} is not an object with a type and a message"
    found = INFRASTRUCTURE.search(f"{error.get('type')} {error.get('message')}")
    return f"it names the storage ({found.group(0)!r})" if found else None


def _brief(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('type')}: {str(error.get('message'))[:160]}"
    return repr(error)[:160]
