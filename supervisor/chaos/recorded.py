"""Reading what a chaos run recorded: step responses, and the plans of `chaos.mixed` executions
(their input), which say which step key is which kind of operation."""

from __future__ import annotations

import json
from typing import Any

MISSING = object()  # no recorded value


def value_of(response_json: str) -> tuple[bool, Any]:
    """(True, value) for a recorded value, (True, None) for a timer, (False, error) for an error."""
    response = json.loads(response_json)
    if "value" in response:
        return True, response["value"]
    if "until" in response:
        return True, None
    return False, response.get("error")


def plan_of(input_json: str) -> Any:
    """The plan in a chaos.mixed input, or None."""
    try:
        return json.loads(input_json).get("plan")
    except (ValueError, AttributeError):
        return None


def plan_keys(input_json: str) -> dict[str, list]:
    """Step key -> its operation, from a chaos.mixed input. A child op has two keys: its start,
    and `KEY.wait`, whose operation reads `["wait", "KEY.wait", "KEY"]`."""
    keys = {}
    for op in plan_of(input_json) or []:
        keys[op[1]] = op
        if op[0] == "child":
            keys[f"{op[1]}.wait"] = ["wait", f"{op[1]}.wait", op[1]]
    return keys


class RecordedValues:
    """The recorded value of a step, for checks that a `Checker` runs (it sets `recorded`)."""

    recorded: dict

    def _recorded_value(self, eid: str, key: str) -> Any:
        row = self.recorded.get((eid, key))
        if row is None:
            return MISSING
        ok, value = value_of(row[5])
        return value if ok else MISSING
